"""silu_mul kernel against TorchOps."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels import silu_mul as silu_mul_module
from services.worker.kernels.silu_mul import silu_mul
from services.worker.models.layers.ops import RowNorm, TorchOps


def _check(t: int, inter: int, dtype: torch.dtype, device: torch.device, tol, hidden: int = 0) -> None:
    """hidden > 0: with a RowNorm over a residual of that width."""
    gate_up = 3 * torch.randn(t, 2 * inter, dtype=dtype, device=device)
    norm = None
    if hidden:
        spread = torch.linspace(0.2, 5.0, t, device=device)[:, None]  # rows' RMS far from 1
        norm = RowNorm((torch.randn(t, hidden, device=device) * spread).to(dtype), 1e-5)
    out = torch.full((t, inter), float("nan"), dtype=dtype, device=device)
    silu_mul(gate_up, out=out, norm=norm)
    torch.testing.assert_close(out, TorchOps().silu_mul(gate_up, norm), **tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "inter"), [(1, 16), (5, 200), (3, 2500)])
def test_silu_mul_small(t: int, inter: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    _check(t, inter, dtype, device, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "inter", "hidden"), [(1, 16, 24), (4, 200, 1500), (3, 2500, 2048)])
def test_silu_mul_with_a_folded_norm(
    t: int, inter: int, hidden: int, dtype: torch.dtype, device: torch.device, tol
) -> None:
    _check(t, inter, dtype, device, tol, hidden)


def test_silu_mul_norm_wider_than_one_load(device: torch.device, tol, monkeypatch: pytest.MonkeyPatch) -> None:
    """A residual row wider than NORM_BLOCK is read in several tiles, summed alike."""
    monkeypatch.setattr(silu_mul_module, "NORM_BLOCK", 256)
    _check(3, 200, torch.float32, device, tol, hidden=1500)


def test_silu_mul_rejects_a_norm_of_other_rows(device: torch.device) -> None:
    gate_up = torch.randn(3, 32, device=device)
    with pytest.raises(ValueError, match=r"norm\.src must be"):
        silu_mul(gate_up, norm=RowNorm(torch.randn(2, 8, device=device), 1e-5))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("hidden", [0, 4096])
def test_silu_mul_llama3_8b(hidden: int, tol) -> None:
    _check(2048, 14336, torch.bfloat16, torch.device("cuda"), tol, hidden)
