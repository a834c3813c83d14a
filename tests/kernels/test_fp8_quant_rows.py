"""fp8_quant_rows against fp8_product.quantize_tokens: the same bytes and scales."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.fp8_quant_rows import ONE_PASS_MAX, fp8_quant_rows, launch_shape
from services.worker.models.layers.fp8_product import quantize_tokens


def _check(x: torch.Tensor, exact: bool = True) -> None:
    """exact: the same bytes; else (the compiled kernel on a GPU) the same values: a value that
    rounds to zero may come out as +0 where PyTorch's cast gives -0."""
    q, s = fp8_quant_rows(x)
    ref_q, ref_s = quantize_tokens(x)
    assert q.shape == x.shape and s.shape == (x.shape[0], 1)
    assert torch.equal(s, ref_s)
    if exact:
        assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    else:
        assert torch.equal(q.float(), ref_q.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter has no bfloat16
@pytest.mark.parametrize(("t", "k"), [(1, 64), (5, 300), (3, 2048 + 96), (2, ONE_PASS_MAX + 300)])
def test_fp8_quant_rows(t: int, k: int, dtype: torch.dtype, device) -> None:
    x = (torch.randn(t, k, device=device) * torch.logspace(-2, 2, t, device=device)[:, None]).to(dtype)
    _check(x)


def test_zero_rows_ties_and_tiny_values(device) -> None:
    x = torch.randn(4, 64, device=device)
    x[0] = 0  # the scale's floor; every value 0
    x[1, :4] = torch.tensor([448.0, 0.5 + 1 / 64, -1e-6, -0.0])  # a tie at scale 1, a subnormal, -0.0
    _check(x)


def test_a_strided_row_view(device) -> None:
    base = torch.randn(6, 256, device=device)
    _check(base[:, 64:192])  # rows 256 apart, 128 wide


def test_launch_shapes() -> None:
    """Rows up to ONE_PASS_MAX in one tile (Llama-3-8B's 4096 and 14336: 8 and 16 warps); longer
    ones in two passes of 4096."""
    assert launch_shape(64) == (64, True, 4)
    assert launch_shape(4096) == (4096, True, 8)
    assert launch_shape(14336) == (16384, True, 16)
    assert launch_shape(ONE_PASS_MAX + 1) == (4096, False, 8)


def test_rejects_a_transposed_input(device) -> None:
    with pytest.raises(ValueError, match="contiguous last dim"):
        fp8_quant_rows(torch.randn(64, 8, device=device).t())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_fp8_quant_rows_llama3_8b_down_input(t: int) -> None:
    _check(torch.randn(t, 14336, device="cuda").to(torch.bfloat16), exact=False)
