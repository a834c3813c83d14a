"""The elementwise and normalisation steps of a layer, as a strategy object.

``TorchOps`` is plain PyTorch written to match Hugging Face's arithmetic (the CPU path
and the kernels' reference); ``services.worker.kernels.triton_ops.TritonOps`` does the
same with one fused Triton kernel per step on CUDA.
"""

from __future__ import annotations

from typing import Protocol

import torch


class LayerOps(Protocol):
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """residual += x (in place, rounded to its dtype); returns rmsnorm(residual) * weight."""
        ...

    def rotary_(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] in place; cos_sin [max_pos, D] (cos | sin)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate | up) -> silu(gate) * up: [T, I]."""
        ...


class TorchOps:
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        residual.add_(x)
        return self.rmsnorm(residual, weight, eps)

    def rotary_(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
        half = cos_sin.shape[1] // 2
        rows = cos_sin[positions]  # [T, D]
        cos = rows[:, None, :half]
        sin = rows[:, None, half:]
        for t in (q, k):
            x1 = t[..., :half].float()
            x2 = t[..., half:].float()
            c = cos.to(t.dtype).float()
            s = sin.to(t.dtype).float()
            r1 = x1 * c - x2 * s
            r2 = x2 * c + x1 * s
            t[..., :half] = r1.to(t.dtype)
            t[..., half:] = r2.to(t.dtype)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        half = gate_up.shape[-1] // 2
        return torch.nn.functional.silu(gate_up[..., :half]) * gate_up[..., half:]
