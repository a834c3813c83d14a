"""layers/fp8_product.py: the CPU path is the dequantizing reference exactly; per-token activation
scales; on an FP8 GPU, torch._scaled_mm and the small-batch Triton kernel against the dequantized
reference (plain, into out, accumulating), each chosen by the row count, and both replayed from
CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.gemm_tiles import FP8_DEFAULT, FP8_TILES, has_tile, lookup
from services.worker.models.fp8_weight import Fp8Weight, fp8_reference
from services.worker.models.layers.fp8_product import (
    TRITON_MAX_M,
    fp8_matmul,
    fp8_scaled_mm,
    fp8_tensor_cores,
    quantize_tokens,
    scaled_mm_fits,
    triton_fits,
)
from services.worker.models.layers.projection import matmul


def test_the_cpu_path_is_the_reference_exactly() -> None:
    w = Fp8Weight.quantize(torch.randn(48, 64))
    x = torch.randn(5, 64)
    assert not scaled_mm_fits(x, w)
    want = x @ w.dequantize().t()
    assert torch.equal(matmul(x, w), want) and torch.equal(fp8_reference(x, w), want)
    base = torch.randn(5, 48)
    assert torch.equal(fp8_matmul(x, w, base.clone(), accumulate=True), base + want)
    out = torch.empty(5, 48)
    assert fp8_matmul(x, w, out, accumulate=False) is out and torch.equal(out, want)


def test_quantize_tokens_scales_each_row_to_448() -> None:
    x = torch.randn(7, 32) * torch.logspace(-3, 3, 7)[:, None]
    x[3] = 0
    q, s = quantize_tokens(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 1) and (s > 0).all()
    absmax = q.float().abs().amax(1)
    assert torch.equal(absmax[torch.arange(7) != 3], torch.full((6,), 448.0)) and absmax[3] == 0
    torch.testing.assert_close(q.float() * s, x, rtol=1 / 16, atol=0)


def test_a_weight_cuts_and_joins_as_a_tensor() -> None:
    w = Fp8Weight.quantize(torch.randn(48, 64))
    rows = w.chunk(2, 0)
    assert [r.shape for r in rows] == [torch.Size((24, 64))] * 2 and torch.equal(rows[1].scale, w.scale[24:])
    cols = w.chunk(2, 1)
    assert cols[0].shape == (48, 32) and torch.equal(cols[0].scale, w.scale)  # row-parallel: scales whole
    joined = torch.cat(w.split([8, 40]))
    assert torch.equal(joined.weight.view(torch.uint8), w.weight.view(torch.uint8)) and torch.equal(
        joined.scale, w.scale
    )
    with pytest.raises(TypeError, match="not defined for fp8 weights"):
        torch.stack([w, w])


cuda_fp8 = pytest.mark.skipif(
    not torch.cuda.is_available() or not fp8_tensor_cores(torch.device("cuda")),
    reason="needs a CUDA GPU with FP8 tensor cores (compute capability 8.9+) under a tested torch",
)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.gpu
@cuda_fp8
@pytest.mark.parametrize("m", [1, 7, 64, 300])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])
def test_scaled_mm_agrees_with_the_dequantized_reference(m: int, n: int, k: int) -> None:
    """Llama-3-8B's qkv and down shapes: the only difference is x's per-token e4m3 rounding (3
    mantissa bits: about 2-3 % relative error on random data, averaged over K)."""
    w = Fp8Weight.quantize(torch.randn(n, k, device="cuda") * k**-0.5)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    assert scaled_mm_fits(x, w)
    want = fp8_reference(x.float(), w)
    got = fp8_scaled_mm(x, w)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    assert _rel(got, want) < 0.04


@pytest.mark.gpu
@cuda_fp8
@pytest.mark.parametrize("m", [1, 7, 16, 17, 64, 300])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])
def test_fp8_matmul_chooses_by_rows_and_agrees(m: int, n: int, k: int) -> None:
    """Up to TRITON_MAX_M rows the Triton kernel, past it FP8_TILES' tile where it has one, else
    _scaled_mm; plain and accumulating. Where x stays bf16 (a tile without x8) only the output's
    bf16 rounding sets it apart from the reference; where x is quantized per token, more."""
    w = Fp8Weight.quantize(torch.randn(n, k, device="cuda") * k**-0.5)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    assert triton_fits(x, w) == (m <= TRITON_MAX_M or has_tile(FP8_TILES, m, n, k))
    want = fp8_reference(x.float(), w)
    got = fp8_matmul(x, w, None, False)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    x_kept = m <= TRITON_MAX_M and not lookup(FP8_TILES, FP8_DEFAULT, m, n, k).x8  # x not quantized
    assert _rel(got, want) < (0.01 if x_kept else 0.04)
    base = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    acc = fp8_matmul(x, w, base.clone(), True)
    assert _rel(acc - base, want) < 0.05


@pytest.mark.gpu
@cuda_fp8
@pytest.mark.parametrize("m", [16, 128])  # the Triton kernel, split over K; _scaled_mm
def test_fp8_matmul_replays_from_a_cuda_graph(m: int) -> None:
    w = Fp8Weight.quantize(torch.randn(1024, 2048, device="cuda") * 2048**-0.5)
    x = torch.randn(m, 2048, device="cuda").to(torch.bfloat16)
    out = torch.empty(m, 1024, device="cuda", dtype=torch.bfloat16)
    fp8_matmul(x, w, out, False)  # warm: kernels compiled, cuBLASLt's workspace and handles, before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fp8_matmul(x, w, out, False)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fp8_matmul(x, w, None, False))
