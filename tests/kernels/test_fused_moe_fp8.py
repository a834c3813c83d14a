"""fused_experts with FP8 experts (Fp8ExpertWeight: e4m3, a float32 scale per expert and output
channel) against layers/moe.py's experts_reference, which dequantizes them; at Mixtral's and
Qwen3-MoE's shapes in bf16 and under a CUDA graph on a GPU."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.fused_moe import MoeTiles, fused_experts
from services.worker.kernels.triton_ops import TritonOps
from services.worker.models.fp8_weight import Fp8ExpertWeight
from services.worker.models.layers.moe import experts_reference, route
from services.worker.models.layers.ops import TorchOps
from tests.kernels.test_fused_moe import REAL_SHAPES, _rel_l2, needs_cuda, replays_new_routings


def _fp8_inputs(t: int, h: int, inter: int, experts: int, k: int, dtype: torch.dtype, device: torch.device, **kw):
    x = torch.randn(t, h, device=device).to(dtype)
    w13 = Fp8ExpertWeight.quantize(torch.randn(experts, 2 * inter, h, device=device) * h**-0.5)
    # rows of very different magnitudes, so a scale applied to the wrong column shows
    w13.scale.mul_(torch.rand(experts, 2 * inter, device=device) * 4 + 0.25)
    w2 = Fp8ExpertWeight.quantize(torch.randn(experts, h, inter, device=device) * inter**-0.5)
    logits = torch.randn(t, experts, device=device).to(dtype)
    weights, ids = route(logits, k, kw.get("renormalize", True), kw.get("weight_dtype", torch.float32))
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("t", "h", "inter", "experts", "k"),
    [(1, 64, 48, 4, 2), (9, 96, 80, 8, 2), (3, 32, 16, 4, 4), (70, 32, 24, 4, 2)],
)
def test_fp8_experts_match_the_reference(
    t: int, h: int, inter: int, experts: int, k: int, dtype: torch.dtype, renormalize: bool, device, tol
) -> None:
    """One token; widths the tiles do not divide; every expert chosen (k = E); 70 tokens, 35
    entries an expert (more than one block of rows); top-k renormalised or not."""
    x, w13, w2, weights, ids = _fp8_inputs(t, h, inter, experts, k, dtype, device, renormalize=renormalize)
    got = fused_experts(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == (t, h)
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), **tol(dtype))


def test_fp8_equals_the_kernel_on_the_dequantized_weights(device: torch.device, tol) -> None:
    """In float32 the scale after the sums and the weight dequantized before them differ by one
    rounding of the weight: the FP8 kernel equals the float32 kernel on the dequantized experts."""
    x, w13, w2, weights, ids = _fp8_inputs(13, 64, 40, 5, 2, torch.float32, device)
    plain = fused_experts(x, w13.dequantize(), w2.dequantize(), weights, ids)
    torch.testing.assert_close(fused_experts(x, w13, w2, weights, ids), plain, **tol(torch.float32))


@pytest.mark.parametrize("fp8", ["w13", "w2"])
def test_each_gemm_takes_either_form(fp8: str, device: torch.device, tol) -> None:
    """FP8 gate|up with float16 down, and the other way round (a checkpoint that quantized one)."""
    x, w13, w2, weights, ids = _fp8_inputs(11, 48, 32, 4, 2, torch.float16, device)
    w13_in = w13 if fp8 == "w13" else w13.dequantize(torch.float16)
    w2_in = w2 if fp8 == "w2" else w2.dequantize(torch.float16)
    torch.testing.assert_close(
        fused_experts(x, w13_in, w2_in, weights, ids), experts_reference(x, w13, w2, weights, ids), **tol(torch.float16)
    )


def test_qwen_routing_and_a_tiling_of_its_own(device: torch.device, tol) -> None:
    """Weights not renormalised, rounded to float16 (the Qwen routers), most tokens on one expert,
    blocks of 32 rows by 16 columns."""
    x, w13, w2, _, _ = _fp8_inputs(24, 32, 16, 4, 2, torch.float16, device)
    logits = torch.randn(24, 4, device=device)
    logits[:, 1] += 3.0
    weights, ids = route(logits.half(), 2, False, torch.float16)
    got = fused_experts(x, w13, w2, weights, ids, MoeTiles(32, 16, 16, 1, 4, 2))
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), **tol(torch.float16))


def test_triton_ops_fp8_experts_match_torch_ops(device: torch.device, tol) -> None:
    x, w13, w2, weights, ids = _fp8_inputs(6, 32, 24, 4, 2, torch.float32, device)
    torch.testing.assert_close(
        TritonOps().experts(x, w13, w2, weights, ids),
        TorchOps().experts(x, w13, w2, weights, ids),
        **tol(torch.float32),
    )


def test_bad_fp8_inputs(device: torch.device) -> None:
    x, w13, w2, weights, ids = _fp8_inputs(2, 32, 16, 4, 2, torch.float32, device)
    assert fused_experts(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 32)
    with pytest.raises(ValueError, match="w2 must be"):
        fused_experts(x, w13, Fp8ExpertWeight(w2.weight[:, :8], w2.scale[:, :8]), weights, ids)
    with pytest.raises(ValueError, match="share a dtype"):
        fused_experts(x, w13, w2.dequantize(torch.float16), weights, ids)


# ---------------------------------------------------------------- GPU: real shapes, graphs


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("t", [1, 2, 16, 64, 256, 1024, 4096])
@pytest.mark.parametrize("shape", sorted(REAL_SHAPES))
def test_real_shapes_fp8_match_the_reference(shape: str, t: int) -> None:
    """Mixtral-8x7B's and Qwen3-30B-A3B's experts in FP8 with bf16 activations, 1 to 4096 tokens:
    the kernel and PyTorch's bf16 loop (weights dequantized to bf16) both within 1e-2 (relative
    L2) of a float32 loop over the same FP8 weights dequantized to float32."""
    g = torch.Generator(device="cuda").manual_seed(t)
    h, inter, experts, top_k, renorm = REAL_SHAPES[shape]
    x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    w13 = Fp8ExpertWeight.quantize(torch.randn(experts, 2 * inter, h, device="cuda", generator=g) * h**-0.5)
    w2 = Fp8ExpertWeight.quantize(torch.randn(experts, h, inter, device="cuda", generator=g) * inter**-0.5)
    weights, ids = route(torch.randn(t, experts, device="cuda", generator=g), top_k, renorm, torch.float32)
    ref = experts_reference(x.float(), w13, w2, weights, ids)
    got, torch_bf16 = fused_experts(x, w13, w2, weights, ids), experts_reference(x, w13, w2, weights, ids)
    print(f"{shape} FP8 T={t}: kernel {_rel_l2(got, ref):.2e}, PyTorch bf16 {_rel_l2(torch_bf16, ref):.2e}")
    assert _rel_l2(got, ref) < 1e-2 and _rel_l2(torch_bf16, ref) < 1e-2


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_graph_replays_fp8_experts() -> None:
    """Captured once, replayed with other inputs and routings: no host sync in the FP8 form either."""
    x, w13, w2, weights, ids = _fp8_inputs(48, 256, 96, 8, 2, torch.bfloat16, torch.device("cuda"))
    replays_new_routings(x, w13, w2, weights, ids)
