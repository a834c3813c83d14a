"""int4_matmul kernel against the reference (dequantize, then PyTorch's matmul): unsplit and split
over K (the decode path), other tiles, warps and stages than the default's, the FMA (dot=False)
tiles at 1 to 4 rows, into out and accumulating; which tile a product takes; at Llama-3-8B's shapes on a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from services.worker.kernels import gemm_tiles
from services.worker.kernels.gemm_tiles import INT4_DEFAULT, Tile
from services.worker.kernels.int4_matmul import choose_tile, int4_matmul
from services.worker.models.int4_formats import from_awq, from_gptq, to_awq, to_gptq
from services.worker.models.int4_weight import Int4Weight, int4_reference


def _weight(n: int, k: int, group: int, method: str, device: torch.device, dtype: torch.dtype) -> Int4Weight:
    w = torch.randn(n, k) * k**-0.5
    t = (to_awq if method == "awq" else to_gptq)(w, group)
    read = from_awq if method == "awq" else from_gptq
    return read(t["qweight"], t["qzeros"], t["scales"], group).to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter has no bfloat16
@pytest.mark.parametrize(
    ("m", "n", "k", "group", "method", "split"),
    [
        (1, 64, 128, 128, "gptq", 1),
        (1, 64, 1024, 128, "awq", None),  # the default split: 2 shares here
        (5, 96, 256, 128, "awq", 2),
        (3, 64, 512, 256, "gptq", 3),  # two K steps a group
        (20, 40, 128, 32, "gptq", 4),
        (40, 64, 256, 64, "awq", 1),
    ],
)
def test_int4_matmul(
    m: int, n: int, k: int, group: int, method: str, split: int | None, dtype: torch.dtype, device, tol
) -> None:
    w = _weight(n, k, group, method, device, dtype)
    x = torch.randn(m, k, device=device).to(dtype)
    out = int4_matmul(x, w, tile=replace(choose_tile(m, w, None), split=split))
    torch.testing.assert_close(out, int4_reference(x, w), **tol(dtype))


@pytest.mark.parametrize(
    "tile",
    [
        Tile(block_n=16, block_k=32, num_warps=2, num_stages=2, split=3),
        Tile(block_n=32, block_k=64, num_warps=8, num_stages=5),
        Tile(block_n=128, block_k=128, num_warps=4, num_stages=4, split=1),
    ],
)
def test_other_tiles(tile: Tile, device, tol) -> None:
    w = _weight(80, 384, 128, "awq", device, torch.float16)
    x = torch.randn(3, 384, device=device, dtype=torch.float16)
    torch.testing.assert_close(int4_matmul(x, w, tile=tile), int4_reference(x, w), **tol(torch.float16))


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "tile",
    [
        Tile(block_n=8, block_k=32, num_warps=1, num_stages=2, split=1, dot=False),
        Tile(block_n=16, block_k=64, num_warps=2, num_stages=3, split=3, dot=False),  # 2 shares, 2 steps a group
    ],
)
def test_fma_tiles(m: int, tile: Tile, device, tol) -> None:
    """The FMA reduction at 1 to 4 rows, unsplit and split, into out and accumulating."""
    w = _weight(40, 256, 128, "gptq", device, torch.float32)
    x = torch.randn(m, 256, device=device)
    torch.testing.assert_close(int4_matmul(x, w, tile=tile), int4_reference(x, w), **tol(torch.float32))
    base = torch.randn(m, 40, device=device)
    acc = int4_matmul(x, w, base.clone(), accumulate=True, tile=tile)
    torch.testing.assert_close(acc, int4_reference(x, w, base.clone(), accumulate=True), **tol(torch.float32))


def test_fma_tile_in_half(device, tol) -> None:
    w = _weight(24, 256, 64, "awq", device, torch.float16)
    x = torch.randn(3, 256, device=device, dtype=torch.float16)
    tile = Tile(block_n=16, block_k=64, num_warps=1, num_stages=1, split=2, dot=False)
    torch.testing.assert_close(int4_matmul(x, w, tile=tile), int4_reference(x, w), **tol(torch.float16))


def test_fma_tile_refuses_five_rows(device) -> None:
    w = _weight(16, 128, 128, "gptq", device, torch.float32)
    with pytest.raises(ValueError, match="dot=False tile serves at most 4 rows"):
        int4_matmul(torch.randn(5, 128, device=device), w, tile=Tile(8, 32, 1, 1, dot=False))


def test_tile_choice(monkeypatch) -> None:
    """The caller's tile; else the table's where its BLOCK_K divides the group; else the default,
    its BLOCK_K cut to a smaller group."""
    w128 = _weight(96, 256, 128, "gptq", torch.device("cpu"), torch.float32)
    w32 = _weight(96, 256, 32, "gptq", torch.device("cpu"), torch.float32)
    assert choose_tile(1, w128, None) == INT4_DEFAULT
    assert choose_tile(1, w32, None) == replace(INT4_DEFAULT, block_k=32)
    mine = Tile(block_n=32, block_k=64, num_warps=2, num_stages=2)
    monkeypatch.setitem(gemm_tiles.INT4_TILES, (96, 256, 4), mine)
    assert choose_tile(3, w128, None) == mine
    assert choose_tile(1, w128, None) == INT4_DEFAULT  # another M bucket
    assert choose_tile(3, w32, None) == replace(INT4_DEFAULT, block_k=32)
    with pytest.raises(ValueError, match="must divide the group size"):
        int4_matmul(torch.randn(1, 256), w32, tile=mine)


@pytest.mark.parametrize("split", [1, 2])
def test_int4_matmul_accumulates_into_out(split: int, device, tol) -> None:
    w = _weight(64, 128, 64, "awq", device, torch.float32)
    x = torch.randn(3, 128, device=device)
    base = torch.randn(3, 64, device=device)
    out = int4_matmul(x, w, base.clone(), accumulate=True, tile=replace(INT4_DEFAULT, block_k=64, split=split))
    torch.testing.assert_close(out, int4_reference(x, w, base.clone(), accumulate=True), **tol(torch.float32))


def test_int4_matmul_rejects_a_wrong_width(device) -> None:
    w = _weight(64, 128, 128, "gptq", device, torch.float32)
    with pytest.raises(ValueError, match="x must be"):
        int4_matmul(torch.randn(2, 64, device=device), w)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 16, 64, 300])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
def test_int4_matmul_llama3_8b(m: int, n: int, k: int, tol) -> None:
    """Llama-3-8B's qkv, o, gate|up and down, in bf16, with the default split."""
    w = _weight(n, k, 128, "awq", torch.device("cuda"), torch.bfloat16)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    torch.testing.assert_close(int4_matmul(x, w), int4_reference(x, w), **tol(torch.bfloat16))
