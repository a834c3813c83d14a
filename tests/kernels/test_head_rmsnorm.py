"""head_rmsnorm_ (q's and k's per-head norms in place, one launch) against TorchOps."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.head_rmsnorm import head_rmsnorm_
from services.worker.models.layers.ops import TorchOps

EPS = 1e-6


def _qkv(t: int, hq: int, hk: int, d: int, dtype: torch.dtype, device: torch.device):
    """q, k, v as views of one projection output with a padded row (as _qkv leaves them)."""
    out = torch.randn(t, (hq + 2 * hk) * d + 16, device=device).to(dtype)
    q = out[:, : hq * d].view(t, hq, d)
    k = out[:, hq * d : (hq + hk) * d].view(t, hk, d)
    v = out[:, (hq + hk) * d : (hq + 2 * hk) * d]
    return out, q, k, v


def _check(t: int, hq: int, hk: int, d: int, dtype: torch.dtype, device: torch.device, tol, unit_offset: bool) -> None:
    out, q, k, v = _qkv(t, hq, hk, d, dtype, device)
    qw, kw = ((1 + 0.2 * torch.randn(d, device=device)).to(dtype) for _ in range(2))
    want = out.clone()
    wq, wk = want[:, : hq * d].view(t, hq, d), want[:, hq * d : (hq + hk) * d].view(t, hk, d)
    TorchOps().head_rmsnorm_(wq, wk, qw, kw, EPS, unit_offset)
    v_before, pad_before = v.clone(), out[:, -16:].clone()
    head_rmsnorm_(q, k, qw, kw, EPS, unit_offset=unit_offset)
    torch.testing.assert_close(out[:, : (hq + hk) * d], want[:, : (hq + hk) * d], **tol(dtype))
    assert torch.equal(v, v_before) and torch.equal(out[:, -16:], pad_before)  # nothing else written


@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "hq", "hk", "d"), [(1, 4, 2, 64), (5, 6, 2, 48), (3, 2, 2, 100)])
def test_head_norms_match_torch(t, hq, hk, d, dtype, unit_offset, device, tol) -> None:
    _check(t, hq, hk, d, dtype, device, tol, unit_offset)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_qwen3_8b_shape_bf16(t: int, tol) -> None:
    """Qwen3-8B's heads (32 q, 8 kv, D 128) and Gemma 3's norm, in bf16."""
    for unit_offset in (False, True):
        _check(t, 32, 8, 128, torch.bfloat16, torch.device("cuda"), tol, unit_offset)


def test_empty_and_bad_inputs(device: torch.device) -> None:
    _, q, k, _ = _qkv(0, 2, 1, 32, torch.float32, device)
    w = torch.ones(32, device=device)
    head_rmsnorm_(q, k, w, w, EPS)  # no tokens: nothing to do
    _, q, k, _ = _qkv(2, 2, 1, 32, torch.float32, device)
    with pytest.raises(ValueError, match="k_weight"):
        head_rmsnorm_(q, k, w, torch.ones(16, device=device), EPS)
    with pytest.raises(ValueError, match="k must be"):
        head_rmsnorm_(q, k.half(), w, w, EPS)
    with pytest.raises(ValueError, match="contiguous in a row"):
        head_rmsnorm_(q, k.transpose(0, 1).contiguous().transpose(0, 1), w, w, EPS)
