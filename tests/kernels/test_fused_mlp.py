"""tools/diag/fused_mlp.py's kernel (an experiment, not the worker's) against the chain it would
replace: a product, TorchOps.silu_mul with the folded norm, a product added into the residual."""

from __future__ import annotations

import pytest
import torch

from services.worker.ops import RowNorm, TorchOps
from tools.diag.fused_mlp import FusedMLP


def _chain(residual: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, eps: float) -> torch.Tensor:
    """What decode_folded's three kernels compute, in float32 with each step rounded to the dtype."""
    gu = (residual.float() @ gate_up.float().t()).to(residual.dtype)
    a = TorchOps().silu_mul(gu, RowNorm(residual, eps))
    return (residual.float() + a.float() @ down.float().t()).to(residual.dtype)


def _weights(t: int, hidden: int, inter: int, dtype: torch.dtype, device: torch.device):
    spread = torch.linspace(0.3, 4.0, t, device=device)[:, None]  # rows' RMS far from 1
    residual = (torch.randn(t, hidden, device=device) * spread).to(dtype)
    gate_up = (torch.randn(2 * inter, hidden, device=device) / hidden**0.5).to(dtype)
    down = (torch.randn(hidden, inter, device=device) / inter**0.5).to(dtype)
    return residual, gate_up, down


@pytest.mark.parametrize("down_t", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("t", "hidden", "inter"), [(1, 64, 96), (3, 32, 48), (16, 48, 16)])
def test_fused_mlp_matches_the_chain(t: int, hidden: int, inter: int, dtype: torch.dtype, down_t: bool,
                                     device: torch.device, tol) -> None:  # fmt: skip
    residual, gate_up, down = _weights(t, hidden, inter, dtype, device)
    want = _chain(residual, gate_up, down, 1e-5)
    mlp = FusedMLP(hidden, inter, 1e-5, device, down_t=down_t)
    for _ in range(2):  # the second launch finds the scratch as the first left it
        got = residual.clone()
        assert mlp(got, gate_up, down.t().contiguous() if down_t else down) is got
        torch.testing.assert_close(got, want, **tol(dtype))
        assert int(mlp.cnt.item()) == 0
        assert not mlp.acc.any()


def test_fused_mlp_splits_the_features_over_programs(device: torch.device) -> None:
    """96 features: three programs of 32, whose partials the last one adds up."""
    mlp = FusedMLP(64, 96, 1e-5, device)
    assert (mlp.block_n, 96 // mlp.block_n) == (32, 3)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((2, 40), (96, 32), (32, 48)), r"got \(2, 40\), \(96, 32\), \(32, 48\)"),
        (((2, 32), (96, 32), (48, 32)), r"got \(2, 32\), \(96, 32\), \(48, 32\)"),
        (((17, 32), (96, 32), (32, 48)), "1 to 16 rows, got 17"),
    ],
)
def test_fused_mlp_rejects_wrong_shapes(shapes, match: str, device: torch.device) -> None:
    mlp = FusedMLP(32, 48, 1e-5, device)
    with pytest.raises(ValueError, match=match):
        mlp(*(torch.randn(*s, device=device) for s in shapes))


def test_fused_mlp_rejects_mixed_dtypes_and_odd_sizes(device: torch.device) -> None:
    mlp = FusedMLP(32, 48, 1e-5, device)
    with pytest.raises(ValueError, match="one dtype"):
        mlp(torch.randn(1, 32, device=device), torch.randn(96, 32, device=device).half(),
            torch.randn(32, 48, device=device))  # fmt: skip
    with pytest.raises(ValueError, match="multiples of 16"):
        FusedMLP(40, 48, 1e-5, device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("down_t", [False, True])
@pytest.mark.parametrize("t", [1, 4])
def test_fused_mlp_llama3_8b(t: int, down_t: bool, tol) -> None:
    """At the 8B shape in bf16: the chain's result within bf16's tolerance, and the same bits on
    every launch (fixed-point partials: the atomics' order does not matter)."""
    device = torch.device("cuda")
    residual, gate_up, down = _weights(t, 4096, 14336, torch.bfloat16, device)
    want = _chain(residual, gate_up, down, 1e-5)
    mlp = FusedMLP(4096, 14336, 1e-5, device, down_t=down_t)
    down = down.t().contiguous() if down_t else down
    first = mlp(residual.clone(), gate_up, down)
    torch.testing.assert_close(first, want, **tol(torch.bfloat16))
    for _ in range(20):
        assert torch.equal(mlp(residual.clone(), gate_up, down), first)
    assert int(mlp.cnt.item()) == 0 and not mlp.acc.any()
