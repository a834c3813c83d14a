"""fused_experts with AWQ's and GPTQ's int4 experts (Int4ExpertWeight: packed rows, a zero point
and a scale a group) against layers/moe.py's experts_reference, which dequantizes them; at
Mixtral's and Qwen3-MoE's shapes in bf16 and under a CUDA graph on a GPU."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.fused_moe import MoeTiles, fused_experts
from services.worker.kernels.triton_ops import TritonOps
from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.int4_formats import quantize_experts
from services.worker.models.int4_weight import Int4LayoutError
from services.worker.models.layers.moe import experts_reference, route
from services.worker.models.layers.ops import TorchOps
from tests.kernels.sass_run import sass_count
from tests.kernels.test_fused_moe import REAL_SHAPES, _rel_l2, needs_cuda, replays_new_routings


def _int4_inputs(t: int, h: int, inter: int, experts: int, k: int, dtype: torch.dtype, device, group: int = 32, **kw):
    x = torch.randn(t, h, device=device).to(dtype)
    symmetric = kw.get("symmetric", False)
    # rows of very different magnitudes, so a group's scale or zero read for the wrong column shows
    rows = torch.rand(experts, 2 * inter, 1, device=device) * 4 + 0.25
    w13 = quantize_experts(
        (torch.randn(experts, 2 * inter, h, device=device) * rows * h**-0.5).to(dtype), group, symmetric
    )
    w2 = quantize_experts((torch.randn(experts, h, inter, device=device) * inter**-0.5).to(dtype), group, symmetric)
    logits = torch.randn(t, experts, device=device).to(dtype)
    weights, ids = route(logits, k, kw.get("renormalize", True), torch.float32)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("t", "h", "inter", "experts", "k", "group"),
    [
        (1, 64, 32, 4, 2, 32),
        (9, 96, 96, 8, 2, 32),
        (3, 64, 64, 4, 4, 64),
        (70, 32, 32, 4, 2, 32),
        (5, 256, 128, 3, 1, 128),
    ],
)
def test_int4_experts_match_the_reference(
    t: int, h: int, inter: int, experts: int, k: int, group: int, dtype: torch.dtype, symmetric: bool, device, tol
) -> None:
    """One token; widths the tiles do not divide (96 columns of 64); every expert chosen (k = E);
    70 tokens, 35 entries an expert (more than one block of rows); a group of 128 (a step is the
    tile's BLOCK_K, several a group); AWQ's zero points and GPTQ's symmetric groups."""
    x, w13, w2, weights, ids = _int4_inputs(t, h, inter, experts, k, dtype, device, group, symmetric=symmetric)
    got = fused_experts(x, w13, w2, weights, ids)
    assert got.dtype == dtype and got.shape == (t, h)
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), **tol(dtype))


def test_int4_equals_the_kernel_on_the_dequantized_weights(device: torch.device) -> None:
    """The tile dequantized in registers is Int4Weight.dequantize's, value for value: in float32
    the int4 kernel equals the kernel on the dequantized experts to the last bit, tiled alike."""
    x, w13, w2, weights, ids = _int4_inputs(13, 64, 64, 5, 2, torch.float32, device)
    tiles = MoeTiles(16, 64, 32, 1, 4, 2)  # BLOCK_K the group: the same sums in the same order
    plain = fused_experts(x, w13.dequantize(), w2.dequantize(), weights, ids, tiles)
    torch.testing.assert_close(fused_experts(x, w13, w2, weights, ids, tiles), plain, rtol=0, atol=0)


@pytest.mark.parametrize("int4", ["w13", "w2"])
def test_each_gemm_takes_either_form(int4: str, device: torch.device, tol) -> None:
    x, w13, w2, weights, ids = _int4_inputs(11, 64, 32, 4, 2, torch.float16, device)
    w13_in = w13 if int4 == "w13" else w13.dequantize()
    w2_in = w2 if int4 == "w2" else w2.dequantize()
    torch.testing.assert_close(
        fused_experts(x, w13_in, w2_in, weights, ids), experts_reference(x, w13, w2, weights, ids), **tol(torch.float16)
    )


def test_a_tiling_of_its_own_and_triton_ops(device: torch.device, tol) -> None:
    """Blocks of 32 rows by 16 columns, BLOCK_K 64 cut to the group of 32; TritonOps' experts
    equal TorchOps' (the CPU path's) on int4 experts."""
    x, w13, w2, weights, ids = _int4_inputs(24, 64, 32, 4, 2, torch.float16, device)
    got = fused_experts(x, w13, w2, weights, ids, MoeTiles(32, 16, 64, 1, 4, 2))
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), **tol(torch.float16))
    torch.testing.assert_close(
        TritonOps().experts(x, w13, w2, weights, ids),
        TorchOps().experts(x, w13, w2, weights, ids),
        **tol(torch.float16),
    )


def test_bad_int4_experts(device: torch.device) -> None:
    x, w13, w2, weights, ids = _int4_inputs(2, 64, 32, 4, 2, torch.float32, device)
    assert fused_experts(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 64)
    with pytest.raises(ValueError, match="w2 must be"):
        fused_experts(
            x, w13, Int4ExpertWeight(w2.qweight[:, :, :8], w2.zeros[:, :, :8], w2.scales[:, :, :8], 32), weights, ids
        )
    with pytest.raises(ValueError, match="share a dtype"):
        fused_experts(x, w13, w2.dequantize(torch.float16), weights, ids)
    with pytest.raises(Int4LayoutError, match="should be"):
        Int4ExpertWeight(w13.qweight, w13.zeros[:, :1], w13.scales[:, :1], 32)
    with pytest.raises(Int4LayoutError, match="multiple of 8 and of the group size"):
        Int4ExpertWeight.empty(2, 16, 48, 32, torch.float32, device)


@pytest.mark.parametrize(("gemm", "tiles", "mma"), [("gate_up", "small", "HMMA"), ("down", "large", "HGMMA")])
def test_int4_tiles_compile_for_sm90_to_tensor_core_products(gemm: str, tiles: str, mma: str) -> None:
    """The INT4 form compiled for an H100/H200 with ptxas (no GPU needed): the dequantized tile
    feeds tensor-core products (HMMA at decode's 16 rows, warpgroup HGMMA at prefill's 64), and
    the packed words come by asynchronous copies (LDGSTS), as a bf16 weight tile would."""
    got = sass_count("moe-int4", "--gemm", gemm, "--tiles", tiles)
    assert got["ops"].get(mma, 0) > 0 and got["ops"].get("LDGSTS", 0) > 0, got["ops"]


# ---------------------------------------------------------------- GPU: real shapes, graphs


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("t", [1, 16, 256, 4096])
@pytest.mark.parametrize("shape", sorted(REAL_SHAPES))
def test_real_shapes_int4_match_the_reference(shape: str, t: int) -> None:
    """Mixtral-8x7B's and Qwen3-30B-A3B's experts in AWQ's int4 (groups of 128) with bf16
    activations: the kernel within 1e-2 (relative L2) of a float32 loop over the same weights."""
    g = torch.Generator(device="cuda").manual_seed(t)
    h, inter, experts, top_k, renorm = REAL_SHAPES[shape]
    x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    w13 = quantize_experts((torch.randn(experts, 2 * inter, h, device="cuda", generator=g) * h**-0.5).bfloat16(), 128)
    w2 = quantize_experts((torch.randn(experts, h, inter, device="cuda", generator=g) * inter**-0.5).bfloat16(), 128)
    weights, ids = route(torch.randn(t, experts, device="cuda", generator=g), top_k, renorm, torch.float32)
    ref = experts_reference(x.float(), w13, w2, weights, ids)
    got = fused_experts(x, w13, w2, weights, ids)
    print(f"{shape} int4 T={t}: kernel {_rel_l2(got, ref):.2e}")
    assert _rel_l2(got, ref) < 1e-2


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_graph_replays_int4_experts() -> None:
    """Captured once, replayed with other inputs and routings: no host sync in the int4 form."""
    x, w13, w2, weights, ids = _int4_inputs(48, 256, 128, 8, 2, torch.bfloat16, torch.device("cuda"), 128)
    replays_new_routings(x, w13, w2, weights, ids)
