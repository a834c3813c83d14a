"""fused_experts (moe_align + the grouped GEMMs) against layers/moe.py's experts_reference,
PyTorch's loop over the experts; at a Mixtral shape in bf16 and under a CUDA graph on a GPU."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.fused_moe import MoeTiles, fused_experts, pick_tiles
from services.worker.kernels.triton_ops import TritonOps
from services.worker.models.layers.moe import experts_reference, route
from services.worker.models.layers.ops import TorchOps


def _inputs(t: int, h: int, inter: int, experts: int, k: int, dtype: torch.dtype, device: torch.device, **route_kw):
    x = torch.randn(t, h, device=device).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, h, device=device) * h**-0.5).to(dtype)
    w2 = (torch.randn(experts, h, inter, device=device) * inter**-0.5).to(dtype)
    logits = torch.randn(t, experts, device=device).to(dtype)
    weights, ids = route(logits, k, route_kw.get("renormalize", True), route_kw.get("weight_dtype", torch.float32))
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("t", "h", "inter", "experts", "k"),
    [(1, 64, 48, 4, 2), (9, 96, 80, 8, 2), (20, 64, 32, 6, 3), (3, 32, 16, 4, 4), (70, 32, 24, 4, 2)],
)
def test_fused_experts_match_the_reference(
    t: int, h: int, inter: int, experts: int, k: int, dtype: torch.dtype, device: torch.device, tol
) -> None:
    """Widths that the tiles do not divide; every expert chosen (k = E); 35 entries an expert
    (pick_tiles' middle configuration)."""
    x, w13, w2, weights, ids = _inputs(t, h, inter, experts, k, dtype, device)
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids), experts_reference(x, w13, w2, weights, ids), **tol(dtype)
    )


@pytest.mark.parametrize(
    "tiles", [MoeTiles(16, 32, 32, 2, 4, 2), MoeTiles(32, 16, 16, 1, 4, 2), MoeTiles(64, 64, 64, 8, 4, 2)]
)
def test_every_tiling_gives_the_same_result(tiles: MoeTiles, device: torch.device, tol) -> None:
    x, w13, w2, weights, ids = _inputs(13, 64, 40, 5, 2, torch.float32, device)
    got = fused_experts(x, w13, w2, weights, ids, tiles)
    torch.testing.assert_close(got, experts_reference(x, w13, w2, weights, ids), **tol(torch.float32))


def test_qwen_routing_weights_in_the_model_dtype_and_skew(device: torch.device, tol) -> None:
    """Weights not renormalised, rounded to float16 (the Qwen routers); most tokens on one expert."""
    x, w13, w2, _, _ = _inputs(24, 32, 16, 4, 2, torch.float16, device)
    logits = torch.randn(24, 4, device=device)
    logits[:, 1] += 3.0
    weights, ids = route(logits.half(), 2, False, torch.float16)
    torch.testing.assert_close(
        fused_experts(x, w13, w2, weights, ids), experts_reference(x, w13, w2, weights, ids), **tol(torch.float16)
    )


def test_triton_ops_experts_match_torch_ops(device: torch.device, tol) -> None:
    x, w13, w2, weights, ids = _inputs(6, 32, 24, 4, 2, torch.float32, device)
    torch.testing.assert_close(
        TritonOps().experts(x, w13, w2, weights, ids),
        TorchOps().experts(x, w13, w2, weights, ids),
        **tol(torch.float32),
    )


def test_no_tokens_and_bad_inputs(device: torch.device) -> None:
    x, w13, w2, weights, ids = _inputs(0, 32, 16, 4, 2, torch.float32, device)
    assert fused_experts(x, w13, w2, weights, ids).shape == (0, 32)
    x, w13, w2, weights, ids = _inputs(2, 32, 16, 4, 2, torch.float32, device)
    with pytest.raises(ValueError, match="w2 must be"):
        fused_experts(x, w13, w2.transpose(1, 2), weights, ids)
    with pytest.raises(ValueError, match="share a dtype"):
        fused_experts(x.half(), w13, w2, weights, ids)
    with pytest.raises(ValueError, match="must both be"):
        fused_experts(x, w13, w2, weights[:1], ids)


def test_pick_tiles_grows_the_blocks_with_the_entries_per_expert() -> None:
    assert pick_tiles(2, 8).block_m == 16
    assert pick_tiles(256, 8).block_m == 32
    assert pick_tiles(4096, 8).block_m == 64
    assert pick_tiles(2, 8, torch.float32).block_k == pick_tiles(2, 8).block_k // 2  # float32: half the K


# ---------------------------------------------------------------- GPU: a real shape, graphs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).norm() / ref.norm()).item()


# hidden, each expert's width, experts, experts per token, renormalised
REAL_SHAPES = {"mixtral-8x7b": (4096, 14336, 8, 2, True), "qwen3-30b-a3b": (2048, 768, 128, 8, True)}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("t", [1, 2, 16, 64, 256, 1024, 4096])
@pytest.mark.parametrize("shape", sorted(REAL_SHAPES))
def test_real_shapes_bf16_match_the_reference(shape: str, t: int) -> None:
    """Mixtral-8x7B's and Qwen3-30B-A3B's experts in bf16, 1 to 4096 tokens: the kernel and
    PyTorch's bf16 loop both within 1e-2 (relative L2) of a float32 loop over the same weights."""
    g = torch.Generator(device="cuda").manual_seed(t)
    h, inter, experts, top_k, renorm = REAL_SHAPES[shape]
    x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    w13 = (torch.randn(experts, 2 * inter, h, device="cuda", generator=g) * h**-0.5).bfloat16()
    w2 = (torch.randn(experts, h, inter, device="cuda", generator=g) * inter**-0.5).bfloat16()
    weights, ids = route(torch.randn(t, experts, device="cuda", generator=g), top_k, renorm, torch.float32)
    ref = experts_reference(x.float(), w13.float(), w2.float(), weights, ids)
    got, torch_bf16 = fused_experts(x, w13, w2, weights, ids), experts_reference(x, w13, w2, weights, ids)
    print(f"{shape} T={t}: kernel {_rel_l2(got, ref):.2e}, PyTorch bf16 {_rel_l2(torch_bf16, ref):.2e}")
    assert _rel_l2(got, ref) < 1e-2 and _rel_l2(torch_bf16, ref) < 1e-2


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_graph_replays_new_routings() -> None:
    """Captured once (a host sync would fail the capture), replayed with other inputs and routings."""
    x, w13, w2, weights, ids = _inputs(48, 256, 96, 8, 2, torch.bfloat16, torch.device("cuda"))
    replays_new_routings(x, w13, w2, weights, ids)


def replays_new_routings(x, w13, w2, weights, ids) -> None:
    """fused_experts captured once in a CUDA graph, then replayed with other x and routings (of
    ids' shape, over w13's experts): each replay equals an eager call, bit for bit."""
    fused_experts(x, w13, w2, weights, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_experts(x, w13, w2, weights, ids)
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        new_w, new_ids = route(
            torch.randn(ids.shape[0], w13.shape[0], device="cuda"), ids.shape[1], True, torch.float32
        )
        weights.copy_(new_w)
        ids.copy_(new_ids)
        graph.replay()
        torch.testing.assert_close(out, fused_experts(x, w13, w2, weights, ids), rtol=0, atol=0)
