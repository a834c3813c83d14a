"""The elementwise and normalisation steps of a layer, and a mixture of experts' routed experts,
as a strategy object.

``TorchOps`` is plain PyTorch written to match Hugging Face's arithmetic (the CPU path
and the kernels' reference); ``services.worker.kernels.triton_ops.TritonOps`` does the
same with one fused Triton kernel per step on CUDA (the experts: a grouped GEMM).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from services.worker.models.layers.moe import experts_reference
from services.worker.models.weights import ExpertWeight


class RowNorm(NamedTuple):
    """An RMSNorm left to the consumer of a product: the rows of src [T, H] (the residual stream)
    whose inverse RMS, rsqrt(mean(src^2) + eps), scales each row of the product's output. With the
    norm's weight folded into the weights the product reads src itself, so (src * r * g) @ W.t()
    becomes r * (src @ (W * g).t()) and the norm costs no kernel of its own (models/fold.py)."""

    src: torch.Tensor
    eps: float

    def inv_rms(self) -> torch.Tensor:
        """-> [T, 1] float32."""
        xf = self.src.float()
        return torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)


def scale_rows(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """x [T, ...] times r [T, 1] (float32, broadcast over x's other dims), rounded to x's dtype."""
    return (x.float() * r.view(r.shape[0], *([1] * (x.dim() - 1)))).to(x.dtype)


class LayerOps(Protocol):
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
        """Llama's RMSNorm: the normalised row rounded to x's dtype, then times weight. unit_offset:
        Gemma's, the row times (1 + weight) in float32, rounded once."""
        ...

    def add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
    ) -> torch.Tensor:
        """residual += x (in place, rounded to its dtype); returns rmsnorm(residual, weight, eps, unit_offset)."""
        ...

    def head_rmsnorm_(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        eps: float,
        unit_offset: bool = False,
    ) -> None:
        """q [T, Hq, D] and k [T, Hk, D] (views of the QKV output) RMS-normed over each head's D
        in place, with q_weight and k_weight [D] (Qwen3's and Gemma 3's head norms)."""
        ...

    def rotary_(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] in place; cos_sin [max_pos, D] (cos | sin)."""
        ...

    def silu_mul(self, gate_up: torch.Tensor, norm: RowNorm | None = None) -> torch.Tensor:
        """[T, 2I] (gate | up) -> silu(gate) * up: [T, I]; given norm, gate and up are first scaled
        by its rows' inverse RMS (scale_rows)."""
        ...

    def experts(
        self, x: torch.Tensor, w13: ExpertWeight, w2: ExpertWeight, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        """x [T, H] through its routed experts: w13 [E, 2I, H], w2 [E, H, I] (each in x's dtype or
        an Fp8ExpertWeight), weights and ids [T, k] (layers/moe.py's route) -> [T, H], the
        weighted sum of each token's k experts."""

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[T, 2I] (gate | up) -> gelu(gate) * up: [T, I], GELU's tanh approximation (Gemma's GeGLU)."""
        ...


class TorchOps:
    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
        xf = x.float() * RowNorm(x, eps).inv_rms()
        if unit_offset:  # Hugging Face's Gemma RMSNorm: (1 + w) in float32, rounded once
            return (xf * (1.0 + weight.float())).to(x.dtype)
        return weight * xf.to(x.dtype)

    def add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
    ) -> torch.Tensor:
        residual.add_(x)
        return self.rmsnorm(residual, weight, eps, unit_offset)

    def head_rmsnorm_(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        eps: float,
        unit_offset: bool = False,
    ) -> None:
        for t, weight in ((q, q_weight), (k, k_weight)):
            t.copy_(self.rmsnorm(t.reshape(-1, t.shape[-1]), weight, eps, unit_offset).view_as(t))

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

    def silu_mul(self, gate_up: torch.Tensor, norm: RowNorm | None = None) -> torch.Tensor:
        if norm is not None:
            gate_up = scale_rows(gate_up, norm.inv_rms())
        half = gate_up.shape[-1] // 2
        return torch.nn.functional.silu(gate_up[..., :half]) * gate_up[..., half:]

    def experts(
        self, x: torch.Tensor, w13: ExpertWeight, w2: ExpertWeight, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        return experts_reference(x, w13, w2, weights, ids)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        half = gate_up.shape[-1] // 2
        return torch.nn.functional.gelu(gate_up[..., :half], approximate="tanh") * gate_up[..., half:]
