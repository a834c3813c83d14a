"""A mixture of experts' routed MLP as two grouped GEMMs over the tokens sorted by expert.

The k expert choices of T tokens are n = T * k entries (entry j: token j // k's choice
j % k), sorted by expert into blocks of BLOCK_M rows (moe_align.py). One kernel, launched
twice; a program computes one block of rows against one BLOCK_N slice of its block's expert:
  1. gate|up (GATE_UP): each entry's token row of x [T, H] times its expert's gate rows and up
     rows of w13 [E, 2I, H], two accumulators, and SiLU(gate) * up in the epilogue -> act [n, I];
  2. down (WEIGHTED): each entry's row of act times its expert's w2 [E, H, I], scaled by the
     entry's routing weight in the epilogue -> [n, H];
then the k rows of each token are summed (PyTorch: a reduction in float32, rounded once).
FP8 experts (HAS_SCALE: models/fp8_weight.py's Fp8ExpertWeight, e4m3 weights with a float32
scale per expert and output channel) are read as e4m3, a weight tile converted to x's dtype in
registers (exactly: every e4m3 value is a bf16 and an fp16 value), and each column's float32
sum multiplied by its channel's scale before the epilogue: weight-only FP8, the activations
stay in their dtype. AWQ's and GPTQ's int4 experts (INT4: models/int4_experts.py's
Int4ExpertWeight, packed rows [E, K / 8, N] with zeros and scales a group) are read a tile's
packed words at a time, BLOCK_K cut to the group so a step reads one row of zeros and scales,
and dequantized in registers, (q - zero) * scale in float32 rounded to x's dtype, exactly as the
reference dequantizes them. Each GEMM takes its weights in any form, w13 and w2 apart.
Blocks whose expert is -1 (past the last run) return at once, so the grid, fixed by T, k
and E, never needs the host: no sync, and the whole of it can be captured in a CUDA graph.

Rounding follows layers/moe.py's experts_reference, which is Hugging Face's: products in the
activation dtype (float32 accumulators rounded once), SiLU in float32 rounded, then the product
with up rounded; the down output rounded before the routing weight multiplies it, and the
weighted output rounded again. float32 inputs multiply exactly (IEEE), not in TF32. FP8 weights'
reference dequantizes them to x's dtype (weight * scale rounded once) before its products, where
the kernel scales the float32 sums: the same arithmetic, but for that one rounding of the weight.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher
from services.worker.kernels.moe_align import AlignedEntries, moe_align
from services.worker.models.fp8_weight import Fp8ExpertWeight
from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.weights import ExpertWeight


@triton.jit
def _fused_moe_kernel(
    a_ptr,
    b_ptr,
    scale_ptr,
    zeros_ptr,
    c_ptr,
    weights_ptr,
    sorted_ptr,
    block_expert_ptr,
    num_entries,
    N,
    K,
    stride_am,
    stride_be,
    stride_bn,
    stride_se,
    stride_cm,
    TOP_K: tl.constexpr,
    GATE_UP: tl.constexpr,
    WEIGHTED: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    INT4: tl.constexpr,
    GROUP: tl.constexpr,
    EVEN_K: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # grouped order: GROUP_M blocks of rows take each slice of columns in turn (the slice's
    # weights stay in L2 while they do)
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    num_m = tl.num_programs(0) // num_n
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    entry = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BLOCK_M]
    valid = entry < num_entries
    rows = tl.where(valid, entry // TOP_K, 0).to(tl.int64)  # TOP_K 1: a row per entry
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :]  # [BLOCK_M, BLOCK_K]
    if INT4:  # packed rows [K / 8, 2N or N] (stride_bn: a packed row's); groups [K / G, ...] (stride_se: an expert's)
        words = tl.arange(0, BLOCK_K // 8)
        b_ptrs = b_ptr + expert.to(tl.int64) * stride_be + words[:, None] * stride_bn + cols[None, :]
        up_ptrs = b_ptrs + N  # up's columns follow gate's (GATE_UP)
        g_ptrs = expert.to(tl.int64) * stride_se + cols  # offsets of a group's zeros and scales
    else:
        b_ptrs = b_ptr + expert.to(tl.int64) * stride_be + cols[None, :].to(tl.int64) * stride_bn + ks[:, None]
        up_ptrs = b_ptrs + N * stride_bn  # the up rows follow the gate rows (GATE_UP)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    dtype = c_ptr.dtype.element_ty  # x's; weight tiles are converted to it (a no-op unless e4m3)
    if INT4:
        b_step = BLOCK_K // 8 * stride_bn
    else:
        b_step = BLOCK_K
    for k0 in range(0, K, BLOCK_K):
        if INT4:  # EVEN_K: BLOCK_K divides the group, and the group K
            step = (k0 // GROUP) * stride_bn + g_ptrs
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            b = _int4_tile(b_ptrs, zeros_ptr + step, scale_ptr + step, col_ok, BLOCK_K, BLOCK_N, dtype)
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=col_ok[None, :], other=0.0).to(dtype)
        else:
            k_ok = ks < K - k0
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(dtype)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if GATE_UP:
            if INT4:
                u = _int4_tile(up_ptrs, zeros_ptr + step + N, scale_ptr + step + N, col_ok, BLOCK_K, BLOCK_N, dtype)
            elif EVEN_K:
                u = tl.load(up_ptrs, mask=col_ok[None, :], other=0.0).to(dtype)
            else:
                u = tl.load(up_ptrs, mask=(ks < K - k0)[:, None] & col_ok[None, :], other=0.0).to(dtype)
            if IEEE:
                acc_up = tl.dot(a, u, acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(a, u, acc_up)
            up_ptrs += b_step
        a_ptrs += BLOCK_K
        b_ptrs += b_step
    if HAS_SCALE:  # FP8 weights: each column's sum times its channel's scale (up's follow gate's)
        s_ptrs = scale_ptr + expert.to(tl.int64) * stride_se + cols
        acc = acc * tl.load(s_ptrs, mask=col_ok, other=0.0)[None, :]
        if GATE_UP:
            acc_up = acc_up * tl.load(s_ptrs + N, mask=col_ok, other=0.0)[None, :]
    out = acc.to(dtype).to(tl.float32)
    if GATE_UP:
        act = (out / (1.0 + tl.exp(-out))).to(dtype).to(tl.float32)
        out = act * acc_up.to(dtype).to(tl.float32)
    if WEIGHTED:
        w = tl.load(weights_ptr + entry, mask=valid, other=0.0).to(tl.float32)
        out = out * w[:, None]
    c_ptrs = c_ptr + tl.where(valid, entry, 0).to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, out.to(dtype), mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _int4_tile(q_ptrs, z_ptrs, s_ptrs, col_ok, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, dtype: tl.constexpr):
    """A [BLOCK_K, BLOCK_N] weight tile from its packed words q_ptrs [BLOCK_K / 8, BLOCK_N] (input
    row 8i + j at bits 4j) and its group's zero points and scales [BLOCK_N]: (q - zero) * scale
    in float32, rounded to dtype, as Int4Weight.dequantize."""
    packed = tl.load(q_ptrs, mask=col_ok[None, :], other=0)
    z = tl.load(z_ptrs, mask=col_ok, other=0).to(tl.int32)
    s = tl.load(s_ptrs, mask=col_ok, other=0.0).to(tl.float32)
    shifts = (tl.arange(0, 8) * 4)[None, :, None]
    q = tl.reshape((packed[:, None, :] >> shifts) & 0xF, (BLOCK_K, BLOCK_N))
    return ((q - z[None, :]).to(tl.float32) * s[None, :]).to(dtype)


_fused_moe_launch = launcher(_fused_moe_kernel)


class MoeTiles(NamedTuple):
    """A launch configuration of the grouped GEMMs."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def pick_tiles(num_entries: int, num_experts: int, dtype: torch.dtype = torch.bfloat16) -> MoeTiles:
    """Small blocks of rows where each expert gets few entries (decode: reading the weights is
    the cost, and a block of 16 wastes least on padding); larger ones as the products grow. The
    pipeline's stages of x's tile and two weight tiles fit an H200's shared memory in 16-bit
    dtypes; float32 tiles are twice the bytes, so they take half as many columns of K."""
    per_expert = num_entries / num_experts
    if per_expert <= 16:
        tiles = MoeTiles(16, 64, 128, 1, 4, 4)
    elif per_expert <= 64:
        tiles = MoeTiles(32, 64, 128, 4, 4, 4)
    else:
        tiles = MoeTiles(64, 128, 64, 8, 8, 3)
    return tiles._replace(block_k=tiles.block_k // 2) if dtype.itemsize > 2 else tiles


def _check(x: torch.Tensor, w13: ExpertWeight, w2: ExpertWeight, weights: torch.Tensor, ids: torch.Tensor) -> None:
    t, h = x.shape if x.dim() == 2 else (-1, -1)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"fused_experts: x must be [T, H] with a contiguous last dim, got {tuple(x.shape)}")
    if w13.dim() != 3 or w13.shape[2] != h or w13.shape[1] % 2 or not w13.is_contiguous():
        raise ValueError(f"fused_experts: w13 must be a contiguous [E, 2I, {h}], got {tuple(w13.shape)}")
    e, inter = w13.shape[0], w13.shape[1] // 2
    if w2.shape != (e, h, inter) or not w2.is_contiguous():
        raise ValueError(f"fused_experts: w2 must be a contiguous [{e}, {h}, {inter}], got {tuple(w2.shape)}")
    for w in (w13, w2):
        if not isinstance(w, Fp8ExpertWeight) and w.dtype != x.dtype:  # int4: its scales' dtype
            raise ValueError(f"fused_experts: x {x.dtype}, w13 {w13.dtype} and w2 {w2.dtype} must share a dtype")
        if w.device != x.device:
            raise ValueError(f"fused_experts: the experts' weights must be on {x.device}, not {w.device}")
    if ids.dim() != 2 or ids.shape[0] != t or weights.shape != ids.shape or not weights.is_contiguous():
        raise ValueError(
            f"fused_experts: weights {tuple(weights.shape)} and ids {tuple(ids.shape)} must both be [{t}, k]"
        )
    if not weights.is_floating_point():
        raise ValueError(f"fused_experts: weights must be floating point, got {weights.dtype}")


def _gemm(
    a: torch.Tensor,
    b: ExpertWeight,
    c: torch.Tensor,
    weights: torch.Tensor,
    aligned: AlignedEntries,
    tiles: MoeTiles,
    top_k: int,
    gate_up: bool,
) -> None:
    """One grouped GEMM: c's rows (one per entry) from a's rows through b's experts."""
    n_out, k_in = c.shape[1], a.shape[1]
    grid = (aligned.block_expert.numel() * cdiv(n_out, tiles.block_n),)
    fp8, int4 = isinstance(b, Fp8ExpertWeight), isinstance(b, Int4ExpertWeight)
    group = b.group_size if int4 else 0
    if int4:  # a step reads one group's zeros and scales; strides: an expert's, a packed row's
        tiles = tiles._replace(block_k=min(tiles.block_k, group))
        b_data, scale, zeros = b.qweight, b.scales, b.zeros
        stride_be, stride_bn, stride_se = b.qweight.stride(0), b.qweight.stride(1), b.scales.stride(0)
    else:
        b_data, scale = (b.weight, b.scale) if fp8 else (b, weights)  # weights: a pointer HAS_SCALE never reads
        zeros, stride_be, stride_bn, stride_se = weights, b_data.stride(0), b_data.stride(1), scale.stride(0)
    _fused_moe_launch[grid](
        a,
        b_data,
        scale,
        zeros,
        c,
        weights,
        aligned.sorted_ids,
        aligned.block_expert,
        c.shape[0],
        n_out,
        k_in,
        a.stride(0),
        stride_be,
        stride_bn,
        stride_se,
        c.stride(0),
        TOP_K=top_k,
        GATE_UP=gate_up,
        WEIGHTED=not gate_up,
        HAS_SCALE=fp8,
        INT4=int4,
        GROUP=group,
        EVEN_K=k_in % tiles.block_k == 0,
        IEEE=a.dtype == torch.float32,
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k,
        GROUP_M=tiles.group_m,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )


def fused_experts(
    x: torch.Tensor,
    w13: ExpertWeight,
    w2: ExpertWeight,
    weights: torch.Tensor,
    ids: torch.Tensor,
    tiles: MoeTiles | None = None,
) -> torch.Tensor:
    """x [T, H] through its routed experts: w13 [E, 2I, H] (each expert's gate rows, then its up
    rows), w2 [E, H, I], each in x's dtype, an Fp8ExpertWeight (e4m3, scales [E, 2I] and [E, H];
    on a GPU of compute capability 8.9 or more, or the interpreter) or an Int4ExpertWeight (its
    scales in x's dtype), weights [T, k] (float) and ids [T, k] (int) from layers/moe.py's route
    -> [T, H] in x's dtype. tiles: the launch configuration, else pick_tiles'."""
    _check(x, w13, w2, weights, ids)
    t, h = x.shape
    e, inter, k = w13.shape[0], w13.shape[1] // 2, ids.shape[1]
    n = t * k
    if n == 0:
        return torch.zeros_like(x)
    tiles = tiles or pick_tiles(n, e, x.dtype)
    aligned = moe_align(ids.contiguous(), e, tiles.block_m)
    act = torch.empty(n, inter, dtype=x.dtype, device=x.device)
    _gemm(x, w13, act, weights, aligned, tiles, k, gate_up=True)
    y = torch.empty(n, h, dtype=x.dtype, device=x.device)
    _gemm(act, w2, y, weights, aligned, tiles, 1, gate_up=False)
    return y.view(t, k, h).sum(dim=1)
