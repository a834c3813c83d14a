"""silu_mul kernel against TorchOps."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.silu_mul import silu_mul
from services.worker.ops import TorchOps


def _check(t: int, inter: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    gate_up = 3 * torch.randn(t, 2 * inter, dtype=dtype, device=device)
    out = torch.full((t, inter), float("nan"), dtype=dtype, device=device)
    silu_mul(gate_up, out=out)
    torch.testing.assert_close(out, TorchOps().silu_mul(gate_up), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "inter"), [(1, 16), (5, 200), (3, 2500)])
def test_silu_mul_small(t: int, inter: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    _check(t, inter, dtype, device, tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_silu_mul_llama3_8b(tol) -> None:
    _check(2048, 14336, torch.bfloat16, torch.device("cuda"), tol)
