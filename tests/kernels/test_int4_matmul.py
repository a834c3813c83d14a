"""int4_matmul kernel against the reference (dequantize, then PyTorch's matmul)."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.int4_matmul import int4_matmul
from services.worker.models.int4_formats import from_awq, from_gptq, to_awq, to_gptq
from services.worker.models.int4_weight import Int4Weight, int4_reference


def _weight(n: int, k: int, group: int, method: str, device: torch.device, dtype: torch.dtype) -> Int4Weight:
    w = torch.randn(n, k) * k**-0.5
    t = (to_awq if method == "awq" else to_gptq)(w, group)
    read = from_awq if method == "awq" else from_gptq
    return read(t["qweight"], t["qzeros"], t["scales"], group).to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter has no bfloat16
@pytest.mark.parametrize(
    ("m", "n", "k", "group", "method"), [(1, 64, 128, 128, "gptq"), (5, 96, 256, 128, "awq"), (20, 40, 128, 32, "gptq")]
)
def test_int4_matmul(m: int, n: int, k: int, group: int, method: str, dtype: torch.dtype, device, tol) -> None:
    w = _weight(n, k, group, method, device, dtype)
    x = torch.randn(m, k, device=device).to(dtype)
    out = int4_matmul(x, w)
    torch.testing.assert_close(out, int4_reference(x, w), **tol(dtype))


def test_int4_matmul_accumulates_into_out(device, tol) -> None:
    w = _weight(64, 128, 64, "awq", device, torch.float32)
    x = torch.randn(3, 128, device=device)
    base = torch.randn(3, 64, device=device)
    out = int4_matmul(x, w, base.clone(), accumulate=True)
    torch.testing.assert_close(out, int4_reference(x, w, base.clone(), accumulate=True), **tol(torch.float32))


def test_int4_matmul_rejects_a_wrong_width(device) -> None:
    w = _weight(64, 128, 128, "gptq", device, torch.float32)
    with pytest.raises(ValueError, match="x must be"):
        int4_matmul(torch.randn(2, 64, device=device), w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 16, 64, 300])
def test_int4_matmul_llama3_8b_down(m: int, tol) -> None:
    w = _weight(4096, 14336, 128, "awq", torch.device("cuda"), torch.bfloat16)
    x = torch.randn(m, 14336, device="cuda").to(torch.bfloat16)
    torch.testing.assert_close(int4_matmul(x, w), int4_reference(x, w), **tol(torch.bfloat16))
