"""fp8_quant_rows against fp8_product.quantize_tokens: the same bytes and scales."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.fp8_quant_rows import fp8_quant_rows
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
@pytest.mark.parametrize(("t", "k"), [(1, 64), (5, 300), (3, 2048 + 96)])
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


def test_rejects_a_transposed_input(device) -> None:
    with pytest.raises(ValueError, match="contiguous last dim"):
        fp8_quant_rows(torch.randn(64, 8, device=device).t())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [1, 64, 4096])
def test_fp8_quant_rows_llama3_8b_down_input(t: int) -> None:
    _check(torch.randn(t, 14336, device="cuda").to(torch.bfloat16), exact=False)
