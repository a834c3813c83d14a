"""TritonOps against TorchOps through the LayerOps interface, as the model calls it."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.triton_ops import TritonOps
from services.worker.models.layers.ops import TorchOps
from services.worker.models.layers.rope import cos_sin_table


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_ops_match_torch_ops(dtype: torch.dtype, device: torch.device, tol) -> None:
    t, hidden, hq, hkv, d, inter = 6, 64, 4, 2, 16, 96
    ops, ref = TritonOps(), TorchOps()
    x = torch.randn(t, hidden, device=device).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    torch.testing.assert_close(ops.rmsnorm(x, w, 1e-6), ref.rmsnorm(x, w, 1e-6), **tol(dtype))

    residual = torch.randn(t, hidden, device=device).to(dtype)
    ref_residual = residual.clone()
    out = ops.add_rmsnorm(x, residual, w, 1e-6)
    torch.testing.assert_close(out, ref.add_rmsnorm(x, ref_residual, w, 1e-6), **tol(dtype))
    torch.testing.assert_close(residual, ref_residual, **tol(dtype))

    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=device).to(dtype)
    ref_qkv = qkv.clone()
    positions = torch.arange(3, 3 + t, device=device)
    cos_sin = cos_sin_table(d, 10000.0, {}, 64, device)
    for impl, packed in ((ops, qkv), (ref, ref_qkv)):
        q = packed[:, : hq * d].view(t, hq, d)
        k = packed[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        impl.head_rmsnorm_(q, k, w[:d], w[d : 2 * d], 1e-6)  # Qwen3's head norms, then rotary
        impl.rotary_(q, k, positions, cos_sin)
    torch.testing.assert_close(qkv, ref_qkv, **tol(dtype))

    gate_up = torch.randn(t, 2 * inter, device=device).to(dtype)
    torch.testing.assert_close(ops.silu_mul(gate_up), ref.silu_mul(gate_up), **tol(dtype))
