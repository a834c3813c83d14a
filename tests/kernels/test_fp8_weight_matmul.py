"""fp8_weight_matmul against the reference (the weight dequantized to x's dtype, then PyTorch's
matmul): unsplit and split over K, a K that is no multiple of the kernel's step, other tiles,
warps and stages than the default's, the FMA (dot=False) tiles at 1 to 4 rows, into out and
accumulating; at Llama-3-8B's projection shapes on a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from services.worker.kernels.fp8_weight_matmul import fp8_weight_matmul
from services.worker.kernels.gemm_tiles import FP8_DEFAULT, FP8_TILES, Tile, lookup
from services.worker.models.fp8_weight import Fp8Weight, fp8_reference
from services.worker.models.layers.fp8_product import tokens_as_quantized


def _weight(n: int, k: int, device: torch.device) -> Fp8Weight:
    return Fp8Weight.quantize(torch.randn(n, k) * k**-0.5).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # the interpreter has no bfloat16
@pytest.mark.parametrize(
    ("m", "n", "k", "split"),
    [(1, 64, 256, 1), (1, 96, 1024, None), (5, 64, 512, 3), (20, 80, 200, 2), (40, 64, 384, None), (70, 32, 128, 1)],
)
def test_fp8_weight_matmul(m: int, n: int, k: int, split: int | None, dtype: torch.dtype, device, tol) -> None:
    w = _weight(n, k, device)
    x = torch.randn(m, k, device=device).to(dtype)
    out = fp8_weight_matmul(x, w, tile=replace(FP8_DEFAULT, split=split))
    assert out.dtype == dtype and out.shape == (m, n)
    torch.testing.assert_close(out, fp8_reference(x, w), **tol(dtype))


@pytest.mark.parametrize(
    "tile",
    [
        Tile(block_n=16, block_k=64, num_warps=2, num_stages=2, split=3),
        Tile(block_n=32, block_k=256, num_warps=8, num_stages=5),  # K of 384: a partial last step
        Tile(block_n=128, block_k=64, num_warps=4, num_stages=3, split=1),
    ],
)
def test_other_tiles(tile: Tile, device, tol) -> None:
    w = _weight(80, 384, device)
    x = torch.randn(3, 384, device=device, dtype=torch.float16)
    torch.testing.assert_close(fp8_weight_matmul(x, w, tile=tile), fp8_reference(x, w), **tol(torch.float16))


@pytest.mark.parametrize("split", [1, 4])
def test_into_out_and_accumulating(split: int, device, tol) -> None:
    w = _weight(64, 512, device)
    x = torch.randn(3, 512, device=device)
    base = torch.randn(3, 64, device=device)
    out = torch.empty(3, 64, device=device)
    tile = replace(FP8_DEFAULT, split=split)
    assert fp8_weight_matmul(x, w, out, tile=tile) is out
    torch.testing.assert_close(out, fp8_reference(x, w), **tol(torch.float32))
    acc = fp8_weight_matmul(x, w, base.clone(), accumulate=True, tile=tile)
    torch.testing.assert_close(acc, fp8_reference(x, w, base.clone(), accumulate=True), **tol(torch.float32))


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "tile",
    [
        Tile(block_n=8, block_k=64, num_warps=1, num_stages=2, split=1, dot=False),
        Tile(block_n=16, block_k=128, num_warps=2, num_stages=3, split=2, dot=False),  # K of 200: odd steps
    ],
)
def test_fma_tiles(m: int, tile: Tile, device, tol) -> None:
    """The FMA reduction at 1 to 4 rows, unsplit and split, over a K that is no multiple of its
    step, into out and accumulating."""
    w = _weight(40, 200, device)
    x = torch.randn(m, 200, device=device)
    torch.testing.assert_close(fp8_weight_matmul(x, w, tile=tile), fp8_reference(x, w), **tol(torch.float32))
    base = torch.randn(m, 40, device=device)
    acc = fp8_weight_matmul(x, w, base.clone(), accumulate=True, tile=tile)
    torch.testing.assert_close(acc, fp8_reference(x, w, base.clone(), accumulate=True), **tol(torch.float32))


def test_fma_tile_in_half(device, tol) -> None:
    w = _weight(24, 256, device)
    x = torch.randn(3, 256, device=device, dtype=torch.float16)
    tile = Tile(block_n=16, block_k=64, num_warps=1, num_stages=1, split=2, dot=False)
    torch.testing.assert_close(fp8_weight_matmul(x, w, tile=tile), fp8_reference(x, w), **tol(torch.float16))


def test_fma_tile_refuses_five_rows(device) -> None:
    with pytest.raises(ValueError, match="dot=False tile serves at most 4 rows"):
        fp8_weight_matmul(
            torch.randn(5, 128, device=device), _weight(16, 128, device), tile=Tile(8, 64, 1, 1, dot=False)
        )


def test_rows_of_a_wider_buffer(device, tol) -> None:
    """x and out as column slices of wider buffers (row strides past their widths)."""
    w = _weight(64, 256, device)
    xs = torch.randn(4, 384, device=device)
    outs = torch.zeros(4, 96, device=device)
    fp8_weight_matmul(xs[:, 64:320], w, outs[:, 16:80], tile=replace(FP8_DEFAULT, split=2))
    torch.testing.assert_close(outs[:, 16:80], fp8_reference(xs[:, 64:320], w), **tol(torch.float32))
    assert not outs[:, :16].any() and not outs[:, 80:].any()


def test_rejects_a_wrong_width(device) -> None:
    with pytest.raises(ValueError, match="x must be"):
        fp8_weight_matmul(torch.randn(2, 64, device=device), _weight(64, 128, device))


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with e4m3 conversions (compute capability 8.9+)",
)
@pytest.mark.parametrize("m", [1, 4, 16, 32, 64, 128])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
def test_llama3_8b_projections(m: int, n: int, k: int, tol) -> None:
    """Llama-3-8B's qkv, o, gate|up and down, in bf16, with FP8_TILES' tile (an x8 tile against
    the reference on the x it quantized)."""
    w = _weight(n, k, torch.device("cuda"))
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    ref_x = tokens_as_quantized(x) if lookup(FP8_TILES, FP8_DEFAULT, m, n, k).x8 else x
    got = fp8_weight_matmul(x, w).float()
    torch.testing.assert_close(got, fp8_reference(ref_x, w).float(), **tol(torch.bfloat16))


@pytest.mark.parametrize(("m", "split"), [(1, 1), (20, 3), (70, None)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_x8_tiles(m: int, split: int | None, accumulate: bool, device, tol) -> None:
    """An x8 tile: x quantized per token to e4m3 (fp8_product.quantize_tokens' bytes), e4m3 dots,
    both scales on the float32 sums; against the reference on the dequantized x."""
    w = _weight(96, 384, device)
    x = (torch.randn(m, 384, device=device) * torch.logspace(-1, 1, m, device=device)[:, None]).to(torch.float16)
    base = torch.randn(m, 96, device=device).to(torch.float16)
    tile = Tile(block_n=32, block_k=128, num_warps=4, num_stages=2, split=split, x8=True)
    got = fp8_weight_matmul(x, w, base.clone() if accumulate else None, accumulate=accumulate, tile=tile)
    want = fp8_reference(tokens_as_quantized(x), w, base.float() if accumulate else None, accumulate=accumulate)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), want, **tol(torch.float16))


def test_x8_needs_dot() -> None:
    with pytest.raises(ValueError, match="x8"):
        Tile(block_n=16, block_k=64, num_warps=2, num_stages=2, dot=False, x8=True)
