"""rmsnorm and add_rmsnorm kernels against TorchOps."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.add_rmsnorm import add_rmsnorm_
from services.worker.kernels.rmsnorm import rmsnorm
from services.worker.models.layers.ops import TorchOps

EPS = 1e-5


def _inputs(t: int, h: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    # x is a column slice of a wider tensor, so its row stride is not h
    x = torch.randn(t, h + 8, dtype=dtype, device=device)[:, :h]
    weight = (1 + 0.1 * torch.randn(h, device=device)).to(dtype)
    return x, weight


def _check_rmsnorm(t: int, h: int, dtype: torch.dtype, device: torch.device, tol, unit_offset: bool = False) -> None:
    x, weight = _inputs(t, h, dtype, device)
    out = torch.full((t, h), float("nan"), dtype=dtype, device=device)
    rmsnorm(x, weight, EPS, out=out, unit_offset=unit_offset)
    torch.testing.assert_close(out, TorchOps().rmsnorm(x, weight, EPS, unit_offset), **tol(dtype))


def _check_add_rmsnorm(
    t: int, h: int, dtype: torch.dtype, device: torch.device, tol, unit_offset: bool = False
) -> None:
    x, weight = _inputs(t, h, dtype, device)
    residual = torch.randn(t, h, dtype=dtype, device=device)
    ref_residual = residual.clone()
    ref = TorchOps().add_rmsnorm(x, ref_residual, weight, EPS, unit_offset)
    out = torch.full((t, h), float("nan"), dtype=dtype, device=device)
    add_rmsnorm_(x, residual, weight, EPS, out=out, unit_offset=unit_offset)
    # the residual sum is one rounding of x + residual in both: it must match exactly
    torch.testing.assert_close(residual, ref_residual, rtol=0, atol=0)
    torch.testing.assert_close(out, ref, **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "h"), [(1, 64), (7, 100)])
def test_rmsnorm_small(t: int, h: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    _check_rmsnorm(t, h, dtype, device, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "h"), [(1, 64), (7, 100)])
def test_add_rmsnorm_small(t: int, h: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    _check_add_rmsnorm(t, h, dtype, device, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "h"), [(1, 64), (7, 100)])
def test_gemma_norms_scale_by_one_plus_the_weight(
    t: int, h: int, dtype: torch.dtype, device: torch.device, tol
) -> None:
    _check_rmsnorm(t, h, dtype, device, tol, unit_offset=True)
    _check_add_rmsnorm(t, h, dtype, device, tol, unit_offset=True)


def test_gemma_norm_is_hugging_faces(device: torch.device) -> None:
    """TorchOps' unit-offset norm is Gemma2RMSNorm's arithmetic, to the bit, in bfloat16."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    x = torch.randn(5, 96, device=device).to(torch.bfloat16)
    hf = Gemma2RMSNorm(96, eps=1e-6).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(0.3 * torch.randn(96))
        assert torch.equal(TorchOps().rmsnorm(x, hf.weight, 1e-6, unit_offset=True), hf(x))


def test_rmsnorm_empty(device: torch.device) -> None:
    x = torch.empty(0, 32, device=device)
    assert rmsnorm(x, torch.ones(32, device=device), EPS).shape == (0, 32)


def test_rmsnorm_rejects_bad_weight(device: torch.device) -> None:
    with pytest.raises(ValueError, match="weight"):
        rmsnorm(torch.randn(2, 32, device=device), torch.ones(16, device=device), EPS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rmsnorm_llama3_8b(tol) -> None:
    device = torch.device("cuda")
    _check_rmsnorm(4096, 4096, torch.bfloat16, device, tol)
    _check_add_rmsnorm(4096, 4096, torch.bfloat16, device, tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gemma_norms_gemma2_2b(tol) -> None:
    """bfloat16 rounds exactly on the GPU (the interpreter's does not): the residual exact, the
    norm within bfloat16's tolerance; and a head norm's rows (Gemma 3's q and k norms)."""
    device = torch.device("cuda")
    _check_rmsnorm(4096, 2304, torch.bfloat16, device, tol, unit_offset=True)
    _check_add_rmsnorm(4096, 2304, torch.bfloat16, device, tol, unit_offset=True)
    _check_rmsnorm(4096 * 8, 256, torch.bfloat16, device, tol, unit_offset=True)
