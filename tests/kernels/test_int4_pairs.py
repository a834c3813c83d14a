"""int4_matmul's one-row path in packed pairs (int4_pairs.py): against the reference in float16
(emulated under the interpreter, which has no bfloat16 and runs no PTX; in PTX on a GPU), when
it is taken, and that its PTX compiles for sm_90 into packed FMAs (ptxas ships with Triton)."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels import int4_matmul as int4_module
from services.worker.kernels.gemm_tiles import Tile
from services.worker.kernels.int4_matmul import int4_matmul, pairs_mode
from services.worker.models.int4_formats import from_awq, from_gptq, to_awq, to_gptq
from services.worker.models.int4_weight import int4_reference
from tests.kernels.sass_run import sass_count


def _weight(n: int, k: int, group: int, method: str, device, dtype: torch.dtype):
    w = torch.randn(n, k) * k**-0.5
    t = (to_awq if method == "awq" else to_gptq)(w, group)
    return (from_awq if method == "awq" else from_gptq)(t["qweight"], t["qzeros"], t["scales"], group).to(device, dtype)


@pytest.mark.parametrize(
    ("n", "k", "group", "tile"),
    [
        (40, 256, 128, Tile(block_n=16, block_k=64, num_warps=2, num_stages=3, split=3, dot=False)),
        (64, 512, 32, Tile(block_n=64, block_k=32, num_warps=1, num_stages=2, split=1, dot=False)),
        (96, 1024, 128, Tile(block_n=32, block_k=128, num_warps=4, num_stages=3, split=None, dot=False)),
    ],
)
@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_one_row_in_pairs(n: int, k: int, group: int, tile: Tile, method: str, device, tol) -> None:
    w = _weight(n, k, group, method, device, torch.float16)
    x = torch.randn(1, k, device=device, dtype=torch.float16)
    assert pairs_mode(x, tile) == (0 if device.type == "cuda" else 2)  # float16: emulated on the CPU only
    torch.testing.assert_close(int4_matmul(x, w, tile=tile), int4_reference(x, w), **tol(torch.float16))
    base = torch.randn(1, n, device=device, dtype=torch.float16)
    got = int4_matmul(x, w, base.clone(), accumulate=True, tile=tile)
    torch.testing.assert_close(got, int4_reference(x, w, base.clone(), accumulate=True), **tol(torch.float16))


def test_when_pairs_are_taken(device, monkeypatch, tol) -> None:
    fma = Tile(block_n=16, block_k=64, num_warps=1, num_stages=1, split=2, dot=False)
    half = torch.randn(1, 128, device=device, dtype=torch.float16)
    on = 0 if device.type == "cuda" else 2  # float16 in PTX could overflow: the float32 path on a GPU
    assert pairs_mode(half, fma) == on
    if device.type == "cuda":
        assert pairs_mode(half.bfloat16(), fma) == 1
    assert pairs_mode(half.float(), fma) == 0  # float32 x: the float32 path
    assert pairs_mode(torch.randn(2, 128, device=device, dtype=torch.float16), fma) == 0  # two rows
    assert pairs_mode(half, Tile(block_n=16, block_k=64, num_warps=1, num_stages=1)) == 0  # a dot tile
    buf = torch.randn(1, 129, device=device, dtype=torch.float16)
    odd = buf[:, 1:]  # x on a 2-byte boundary: its words would straddle two values
    assert pairs_mode(odd, fma) == 0
    w = _weight(24, 128, 64, "awq", device, torch.float16)
    torch.testing.assert_close(int4_matmul(odd, w, tile=fma), int4_reference(odd, w), **tol(torch.float16))
    monkeypatch.setattr(int4_module, "PAIRS", False)
    assert pairs_mode(half, fma) == 0


def test_pairs_ptx_compiles_for_sm90() -> None:
    """The one-row kernel in PTX through ptxas for an H100/H200 (tools/sass_count.py, in a process
    without the interpreter): packed FMAs, and fewer instructions a weight than the float32 path."""
    pairs = sass_count("int4-one-row", "--pairs", "1", "--dtype", "bf16")
    plain = sass_count("int4-one-row", "--pairs", "0", "--dtype", "bf16")
    assert pairs["ops"]["HFMA2"] >= 4 * 32  # four packed FMAs a word at least, 32 words a thread a step
    assert pairs["per_weight"] < 0.7 * plain["per_weight"], (pairs["per_weight"], plain["per_weight"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("size", [1.0, 3.0e4])  # x of 30,000: beyond float16's reach in these sums
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (28672, 4096), (4096, 14336)])
def test_pairs_llama3_8b_one_row(n: int, k: int, size: float, tol) -> None:
    """Llama-3-8B's qkv, gate|up and down at one row of bfloat16, the table's tiles, in PTX,
    against the float32 path and the reference."""
    dtype = torch.bfloat16
    w = _weight(n, k, 128, "awq", torch.device("cuda"), dtype)
    x = (torch.randn(1, k, device="cuda") * size).to(dtype)
    # rounding grows with x's size (bf16's step at 32,768 is 256), so both sides are compared at x's scale
    got = int4_matmul(x, w).float() / size
    torch.testing.assert_close(got, int4_reference(x, w).float() / size, **tol(dtype))
    int4_module.PAIRS = False
    try:
        plain = int4_matmul(x, w).float() / size
    finally:
        int4_module.PAIRS = True
    torch.testing.assert_close(got, plain, **tol(dtype))
