"""Decode attention over the token KV pool: flash-decoding with split-K.

Each decoding request has one query token. Stage 1 runs a program per (request, KV head,
split): the program takes every query head that shares the KV head (the GQA group, padded
to 16 rows so tl.dot applies) and one contiguous slice of the request's context, gathers
the K/V rows through req_table[row, pos] -> slot in BLOCK_N tiles, and writes the slice's
normalised partial output and its log-sum-exp (base 2) to float32 scratch. Reading each
KV row once per group, not once per query head, is what makes GQA decode bandwidth-bound
instead of load-issue-bound. Stage 2 combines the splits of each (request, query head).

Nothing here reads device data on the host and the grid depends only on Python ints, so
both launches can be captured in a CUDA graph. Splits past the end of a shorter request
exit at once; the reduce recomputes the same split boundaries and ignores them. With one
split per request (batches that fill the GPU on their own) stage 1 writes the output
itself and the reduce is not launched. Given a counter per (request, KV head), the split
that finishes last combines the others' partials itself (an atomic count, acquire-release),
and the reduce is not launched either: at small batches that kernel costs a launch's
latency for a few microseconds of work.

Given the new tokens as projected (NewTokens: a decode-only step, a float pool), stage 1 also
does what rotary_store would have done before it: each split rotates its q and the new k in
registers, the request's last split writes k and v to the pool and folds the token into its
softmax from registers before its KV loop, and the other splits stop a token short of the
context. The kernels are specialised on nothing that differs between such a call and one
without new tokens or with another split count, so steps with prompt tokens run what the
decode graphs' capture compiled. Given a RowNorm with the new tokens (the layer's norm
folded into the QKV weights, models/fold.py), each program scales q, k and v by the inverse
RMS of its request's row of the residual, which it computes, before it rotates them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from services.worker.kernels.extend_attention import check_pool, dot, online_softmax_step
from services.worker.kernels.kv_store import check_kv_store_args
from services.worker.kernels.launch import cdiv, launcher, next_pow2
from services.worker.kernels.rmsnorm import check_row_norm, row_inv_rms
from services.worker.kernels.rotary import check_rotary_args, load_cos_sin, load_halves, rotate_loaded
from services.worker.models.layers.ops import RowNorm

LOG2E = 1.4426950408889634
MAX_SPLITS = 32
# elements of a folded norm's residual row read at a time (row_inv_rms): the 8B shape's whole
# row in one load. A loop of smaller tiles waits for each tile's load before it asks for the
# next, a memory round trip each, on the path of every program. The same for every call, with
# or without a norm, so both run one compiled kernel.
NORM_BLOCK = 4096
# the last split's combine loads this many splits' partials at a time: a fixed tile, so one
# compiled kernel serves every split count
COMBINE_SPLITS = 8
# the fewest tokens a split of a request is given (see split_tokens). On an H200 (8B shape,
# docs/benchmarks.md r33) the whole decode step, replayed from its graph, at batch 1 and
# context 1024 took 4.81 ms with 64 (16 splits) against 4.97 with 256 (4 splits), 4.85 with
# 128 and 4.81 with 32; batches of 8 or more gave the same at any of these, since their
# grid's split count, not this, bounds their splits (and from 64 requests it is one)
SPLIT_TOKENS = 64


@triton.jit
def _split_len(seq_len, num_splits, split_tokens, BLOCK_N: tl.constexpr):
    """Tokens per split of one request: its context over the splits it uses, at most
    num_splits (the grid's) and fewer for a short context, so no split has much under
    split_tokens; whole tiles each. Splits past the last used one find nothing to do."""
    used = tl.maximum(tl.minimum(num_splits, tl.cdiv(seq_len, split_tokens)), 1)
    return tl.cdiv(tl.cdiv(seq_len, used), BLOCK_N) * BLOCK_N


# Not specialised on what changes between the decode graphs' calls and those of steps with
# prompt tokens (eager attention), so that the latter run kernels the graphs' capture compiled
# (r73): the split count, and the scratch's strides, which follow it; the new tokens' flag and
# strides (without new tokens the kernel gets stand-ins: q for k and v, the scratch for
# cos_sin); the scales' strides (the scratch stands in for a float pool's); the norm's row stride
# and width (without one, q stands in for its rows and the width is 0).
@triton.jit(
    do_not_specialize=[
        "num_splits",
        "split_tokens",
        "rotary",
        "kn_b_stride",
        "kn_h_stride",
        "vn_b_stride",
        "vn_h_stride",
        "cs_row_stride",
        "o_b_stride",
        "o_h_stride",
        "o_s_stride",
        "lse_b_stride",
        "lse_h_stride",
        "ks_slot_stride",
        "ks_h_stride",
        "vs_slot_stride",
        "vs_h_stride",
        "nrm_b_stride",
        "hidden",
    ]
)
def _decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    rows_ptr,
    lens_ptr,
    mid_o_ptr,
    mid_lse_ptr,
    cnt_ptr,
    out_ptr,
    kn_ptr,
    vn_ptr,
    slot_ptr,
    cs_ptr,
    nrm_ptr,
    nrm_b_stride,
    hidden,
    nrm_eps,
    q_b_stride,
    q_h_stride,
    k_slot_stride,
    k_h_stride,
    v_slot_stride,
    v_h_stride,
    ks_slot_stride,
    ks_h_stride,
    vs_slot_stride,
    vs_h_stride,
    table_stride,
    o_b_stride,
    o_h_stride,
    o_s_stride,
    lse_b_stride,
    lse_h_stride,
    out_b_stride,
    out_h_stride,
    kn_b_stride,
    kn_h_stride,
    vn_b_stride,
    vn_h_stride,
    cs_row_stride,
    qk_scale,
    num_splits,
    split_tokens,
    rotary,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    QUANT: tl.constexpr,
    IEEE: tl.constexpr,
    DIRECT: tl.constexpr,
    FUSED: tl.constexpr,
):
    """DIRECT (one split): mid_o_ptr and its b/h strides are the output's; no log-sum-exp.
    FUSED (several splits): the last split of a (request, KV head) to finish combines them
    into out_ptr, counting in cnt_ptr [B, Hkv] (zero before, left zero after).
    rotary (nonzero): q (q_ptr) and the new token's k and v (kn_ptr, vn_ptr) are as projected,
    and the new token is not in the pool yet: each split rotates q and k (position seq_len - 1,
    table cs_ptr); the request's last split stores k and v at slot_ptr[b] and folds the token
    in. A runtime flag, not a constexpr: steps with prompt tokens (whose decodes were
    rotated and stored before) then run the kernels the decode graphs compiled.
    hidden (nonzero, with rotary): q, k and v are each first scaled by the inverse RMS of row b
    of nrm_ptr [B, hidden] (eps nrm_eps)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(lens_ptr + b)
    row = tl.load(rows_ptr + b).to(tl.int64)
    # the folded norm's factor (reads nothing without a norm, hidden 0), its row read while the
    # length and the table row are on their way rather than after them
    inv_rms = row_inv_rms(nrm_ptr + b.to(tl.int64) * nrm_b_stride, hidden, nrm_eps, NORM_BLOCK)
    split_len = _split_len(seq_len, num_splits, split_tokens, BLOCK_N)
    begin = split * split_len
    if not DIRECT:  # noqa: SIM102 (a compile-time branch: Triton drops it whole for DIRECT)
        if begin >= seq_len:
            if FUSED:  # noqa: SIM102
                if seq_len == 0 and split == 0:  # an empty request: the combine of no splits, zeros
                    for g in tl.static_range(GROUP):
                        _combine_head(
                            mid_o_ptr,
                            mid_lse_ptr,
                            out_ptr,
                            b,
                            kvh * GROUP + g,
                            0,
                            o_b_stride,
                            o_h_stride,
                            o_s_stride,
                            lse_b_stride,
                            lse_h_stride,
                            out_b_stride,
                            out_h_stride,
                            HEAD_DIM,
                            BLOCK_S,
                            BLOCK_D,
                        )
            return
    end = tl.minimum(begin + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    gmask = offs_g < GROUP
    dmask = offs_d < HEAD_DIM
    q_rows = q_ptr + b.to(tl.int64) * q_b_stride + heads[:, None] * q_h_stride
    qmask = gmask[:, None] & dmask[None, :]
    token_pos = (seq_len - 1).to(tl.int64)  # a decode's new token: position kv_len, seq_len kv_len + 1
    scale = tl.where(hidden > 0, inv_rms, 1.0)
    # a finite floor instead of -inf keeps exp2(m_old - m_new) at 0, never NaN
    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    if rotary:
        # q, the new token's k and v, its slot and their cos and sin, all asked for before any is
        # used; the new token is folded in first, so nothing of it is held through the loop
        half: tl.constexpr = HEAD_DIM // 2
        q_x, q_xp = load_halves(q_rows, offs_d[None, :], qmask, half)
        k_x, k_xp = load_halves(kn_ptr + b.to(tl.int64) * kn_b_stride + kvh * kn_h_stride, offs_d, dmask, half)
        v_x = tl.load(vn_ptr + b.to(tl.int64) * vn_b_stride + kvh * vn_h_stride + offs_d, mask=dmask, other=0.0)
        slot = tl.load(slot_ptr + b).to(tl.int64)
        cos, sin = load_cos_sin(cs_ptr, token_pos, cs_row_stride, offs_d, half)
        first = offs_d < half
        q = rotate_loaded(q_x, q_xp, cos[None, :], sin[None, :], first[None, :], scale)  # [BLOCK_G, BLOCK_D]
        k_new = rotate_loaded(k_x, k_xp, cos, sin, first, scale)  # [BLOCK_D]
        v_new = (v_x.to(tl.float32) * scale).to(v_x.dtype)
        last = (end == seq_len) & (seq_len > 0)
        acc, m_i, l_i = _fold_new_token(
            acc,
            m_i,
            l_i,
            q,
            last,
            k_new,
            v_new,
            k_ptr,
            v_ptr,
            slot,
            kvh,
            k_slot_stride,
            k_h_stride,
            v_slot_stride,
            v_h_stride,
            qk_scale,
            offs_d,
            half,
        )
        pool_end = tl.minimum(end, seq_len - 1)  # the new token is in already
    else:
        q = tl.load(q_rows + offs_d[None, :], mask=qmask, other=0.0)  # [BLOCK_G, BLOCK_D]
        pool_end = end
    for start in range(begin, pool_end, BLOCK_N):
        pos = start + offs_n
        nmask = pos < pool_end
        slots = tl.load(table_ptr + row * table_stride + pos, mask=nmask, other=0).to(tl.int64)  # [BLOCK_N]
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + slots[:, None] * k_slot_stride + kvh * k_h_stride + offs_d[None, :], mask=kv_mask, other=0)
        v = tl.load(v_ptr + slots[:, None] * v_slot_stride + kvh * v_h_stride + offs_d[None, :], mask=kv_mask, other=0)
        if QUANT:
            k_s = tl.load(ks_ptr + slots * ks_slot_stride + kvh * ks_h_stride, mask=nmask, other=0.0)
            v_s = tl.load(vs_ptr + slots * vs_slot_stride + kvh * vs_h_stride, mask=nmask, other=0.0)
            qk = dot(q, tl.trans(k.to(q.dtype)), IEEE) * k_s[None, :]  # [BLOCK_G, BLOCK_N]
        else:
            v_s = None
            qk = dot(q, tl.trans(k), IEEE)
        qk = tl.where(nmask[None, :], qk, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, qk, qk_scale, v, v_s, q.dtype, QUANT, IEEE)

    o_ptrs = mid_o_ptr + b.to(tl.int64) * o_b_stride + heads[:, None] * o_h_stride + offs_d[None, :]
    if DIRECT:  # an empty request (a padded graph row) gets zeros, not NaN, as from the reduce
        result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptrs, result.to(mid_o_ptr.dtype.element_ty), mask=qmask)
    else:
        tl.store(o_ptrs + split * o_s_stride, acc / l_i[:, None], mask=qmask)
        lse_ptrs = mid_lse_ptr + b.to(tl.int64) * lse_b_stride + heads * lse_h_stride + split
        tl.store(lse_ptrs, m_i + tl.log2(l_i), mask=gmask)
        if FUSED:
            # every thread's stores are made before the count is (the barrier, then a release);
            # the program that counts last sees all the splits' (acquire, reads through L2)
            tl.debug_barrier()
            cnt = cnt_ptr + b * tl.num_programs(1) + kvh
            used = tl.cdiv(seq_len, split_len)
            if tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == used - 1:
                tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # ready for the next launch
                for g in tl.static_range(GROUP):
                    _combine_head(
                        mid_o_ptr,
                        mid_lse_ptr,
                        out_ptr,
                        b,
                        kvh * GROUP + g,
                        used,
                        o_b_stride,
                        o_h_stride,
                        o_s_stride,
                        lse_b_stride,
                        lse_h_stride,
                        out_b_stride,
                        out_h_stride,
                        HEAD_DIM,
                        BLOCK_S,
                        BLOCK_D,
                    )


@triton.jit
def _fold_new_token(
    acc,
    m_i,
    l_i,
    q,
    last,
    k,
    v,
    kp_ptr,
    vp_ptr,
    slot,
    kvh,
    kp_slot_stride,
    kp_h_stride,
    vp_slot_stride,
    vp_h_stride,
    qk_scale,
    offs_d,
    HALF: tl.constexpr,
):
    """The request's new token (k rotated, k and v scaled by the folded norm's factor, [BLOCK_D]),
    for its last split (last; other splits get their state back as it was): k and v stored in
    the pool at slot, and the token folded into the running softmax as online_softmax_step folds
    a tile (p rounded to q's dtype for the sum)."""
    store = offs_d < tl.where(last, 2 * HALF, 0)  # the whole head in the last split, else nothing
    tl.store(kp_ptr + slot * kp_slot_stride + kvh * kp_h_stride + offs_d, k.to(kp_ptr.dtype.element_ty), mask=store)
    tl.store(vp_ptr + slot * vp_slot_stride + kvh * vp_h_stride + offs_d, v.to(vp_ptr.dtype.element_ty), mask=store)
    qk = tl.sum(q.to(tl.float32) * k.to(tl.float32)[None, :], axis=1)  # [BLOCK_G]
    qk = tl.where(last, qk * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, qk)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p.to(q.dtype).to(tl.float32)[:, None] * v.to(tl.float32)[None, :]
    return acc, m_new, l_i


@triton.jit
def _combine_head(
    mid_o_ptr,
    mid_lse_ptr,
    out_ptr,
    b,
    h,
    used,
    o_b_stride,
    o_h_stride,
    o_s_stride,
    lse_b_stride,
    lse_h_stride,
    out_b_stride,
    out_h_stride,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """out[b, h] = the first ``used`` splits' partial outputs weighed by their log-sum-exps
    (base 2), loaded BLOCK_S splits at a time (through L2: the last split reads what the
    others wrote); zeros when used is 0 (an empty request)."""
    b = b.to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < HEAD_DIM
    lse_row = mid_lse_ptr + b * lse_b_stride + h * lse_h_stride
    o_rows = mid_o_ptr + b * o_b_stride + h * o_h_stride
    m = tl.max(tl.full([BLOCK_S], -1.0e30, dtype=tl.float32), axis=0)  # a finite floor: no NaN
    total = tl.sum(tl.zeros([BLOCK_S], dtype=tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for first in range(0, used, BLOCK_S):
        splits = first + offs_s
        valid = splits < used
        lse = tl.load(lse_row + splits, mask=valid, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(
            o_rows + splits[:, None] * o_s_stride + offs_d[None, :],
            mask=valid[:, None] & dmask[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)  # 0 where not valid
        acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
        total = total * alpha + tl.sum(w, axis=0)
        m = m_new
    result = acc / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * out_b_stride + h * out_h_stride + offs_d, result.to(out_ptr.dtype.element_ty), mask=dmask)


_decode_split_launch = launcher(_decode_split_kernel)


# the scratch's strides follow the split count: not specialised on either (see above); it loads
# all MAX_SPLITS splits' places at once (the unused masked), so one compiled kernel serves all counts
@triton.jit(
    do_not_specialize=[
        "num_splits",
        "split_tokens",
        "o_b_stride",
        "o_h_stride",
        "o_s_stride",
        "lse_b_stride",
        "lse_h_stride",
    ]
)
def _decode_reduce_kernel(
    mid_o_ptr,
    mid_lse_ptr,
    lens_ptr,
    out_ptr,
    o_b_stride,
    o_h_stride,
    o_s_stride,
    lse_b_stride,
    lse_h_stride,
    out_b_stride,
    out_h_stride,
    num_splits,
    split_tokens,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(lens_ptr + b)
    split_len = _split_len(seq_len, num_splits, split_tokens, BLOCK_N)
    # the splits stage 1 ran, recomputed (none for an empty request, whose split_len is 0)
    used = tl.where(seq_len > 0, tl.minimum(num_splits, tl.cdiv(seq_len, tl.maximum(split_len, 1))), 0)
    _combine_head(
        mid_o_ptr,
        mid_lse_ptr,
        out_ptr,
        b,
        h,
        used,
        o_b_stride,
        o_h_stride,
        o_s_stride,
        lse_b_stride,
        lse_h_stride,
        out_b_stride,
        out_h_stride,
        HEAD_DIM,
        BLOCK_S,
        BLOCK_D,
    )


_decode_reduce_launch = launcher(_decode_reduce_kernel)


def decode_config(head_dim: int, dtype: torch.dtype, is_cuda: bool, quantized: bool = False) -> dict[str, int]:
    """BLOCK_N / num_warps / num_stages of stage 1; small tiles in the interpreter keep tests fast.
    bf16 / fp16 pools: 2 warps and 3 stages (r64, tools/diag/decode_small.py, 32 layers' pools
    replayed from a graph on an H200) took a layer's attention at context 1024 from 267.5 to
    247.7 µs at batch 256 and 66.6 to 65.5 at batch 64, and gave the same or a little less at
    batches 1 and 4. An int8 pool: 128-token tiles, 4 warps, 2 stages (r141–r142,
    tools/diag/decode_int8.py): 112 µs a layer at batch 64 and context 2048 against 258 with
    64 / 4 / 2; the fastest of 19 configs at batches 64 and 256, within 0.1 µs of the fastest
    at batch 1, and faster than the bf16 pool's kernel on the same requests."""
    if not is_cuda:
        return {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32 or head_dim > 128:
        return {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    if quantized:
        return {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2}
    return {"BLOCK_N": 64, "num_warps": 2, "num_stages": 3}


def choose_num_splits(batch: int, kv_heads: int, max_len: int, num_sms: int = 132, min_tokens: int = 128) -> int:
    """Splits per request so that stage 1 has about two programs per SM, each split covering
    at least min_tokens (shorter splits cost more in the combine than they save): two of a
    float pool's tiles (split_min_tokens). On an H200 at batch 64, context 2048, one split (3.9
    programs per SM) beat two by 4%."""
    programs = max(1, batch * kv_heads)
    want = cdiv(2 * num_sms, programs)
    return max(1, min(want, max_len // min_tokens, MAX_SPLITS))


def split_min_tokens(head_dim: int, dtype: torch.dtype, is_cuda: bool) -> int:
    """choose_num_splits's min_tokens: two of a float pool's tiles, an int8 pool's too. An int8
    pool's one-tile splits of 128 tokens took a lone request's attention at context 1024 in
    9.1 µs a layer, against 11.8 in its two-tile splits (r142, r143)."""
    return 2 * decode_config(head_dim, dtype, is_cuda)["BLOCK_N"]


def decode_scratch(
    batch: int, num_heads: int, head_dim: int, num_splits: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial outputs [B, Hq, splits, D], log-sum-exps [B, Hq, splits]), float32."""
    mid_o = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=device)
    mid_lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=device)
    return mid_o, mid_lse


class NewTokens(NamedTuple):
    """The decoding requests' new tokens as projected: k and v [B, Hkv, D], neither rotated nor
    stored yet, going to the pool at slots [B] (int32). Each sits at position seq_len - 1 of
    its request, as every decode's token does (batch_builder), rotated by that row of cos_sin
    [max_pos, D] float32."""

    k: torch.Tensor
    v: torch.Tensor
    cos_sin: torch.Tensor
    slots: torch.Tensor
    norm: RowNorm | None = None  # the layer's norm, folded into the QKV weights: src [B, H] in q's dtype


def decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_table: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    split_tokens: int = 1,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    mid_o: torch.Tensor | None = None,
    mid_lse: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
    new: NewTokens | None = None,
    **config: int,
) -> torch.Tensor:
    """q: [B, Hq, D] one token per request; pools: [C, Hkv, D]; rows, seq_lens: [B] int32, seq_lens
    counting the new token (already stored). k_scale, v_scale [C, Hkv] float32 mark an int8 pool.
    num_splits is the grid's splits per request; a request whose context is short uses fewer,
    none of under split_tokens tokens (so one captured grid suits every context length).
    mid_o / mid_lse: scratch from decode_scratch (allocated when None). counts: int32 zeros, at
    least B * Hkv, left zero: with several splits, the last split of each (request, KV head)
    combines them, and the reduce kernel is not launched (without it, it is). new: the new
    tokens' k and v not yet in the pool (a float pool): the kernel rotates q (in registers, q
    itself is left as it is) and k, and stores k and v, as rotary_store_ would have before it;
    with new.norm it first scales q, k and v by their rows' inverse RMS (ops.RowNorm).
    config overrides BLOCK_N / num_warps / num_stages. Returns out [B, Hq, D]."""
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(f"decode_attention: q must be [B, Hq, D] with a contiguous last dim, got {tuple(q.shape)}")
    bsz, hq, d = q.shape
    hkv = check_pool("decode_attention", q, k_pool, v_pool, k_scale, v_scale)
    for name, x in (("rows", rows), ("seq_lens", seq_lens)):
        if x.shape != (bsz,) or x.dtype != torch.int32:
            raise ValueError(f"decode_attention: {name} must be [{bsz}] int32, got {tuple(x.shape)} {x.dtype}")
    if req_table.dim() != 2 or req_table.dtype != torch.int32 or req_table.stride(-1) != 1:
        raise ValueError("decode_attention: req_table must be a 2-d int32 tensor with a contiguous last dim")
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"decode_attention: num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    if split_tokens < 1:
        raise ValueError(f"decode_attention: split_tokens must be at least 1, got {split_tokens}")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"decode_attention: out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    if mid_o is None or mid_lse is None:
        mid_o, mid_lse = decode_scratch(bsz, hq, d, num_splits, q.device)
    if mid_o.shape != (bsz, hq, num_splits, d) or mid_lse.shape != (bsz, hq, num_splits):
        raise ValueError(
            f"decode_attention: scratch must be [{bsz}, {hq}, {num_splits}, {d}] and [{bsz}, {hq}, {num_splits}]"
        )
    if (
        mid_o.dtype != torch.float32
        or mid_lse.dtype != torch.float32
        or mid_o.stride(-1) != 1
        or mid_lse.stride(-1) != 1
    ):
        raise ValueError("decode_attention: scratch must be float32 with a contiguous last dim")
    if new is not None:
        check_rotary_args("decode_attention", q, new.k, seq_lens, new.cos_sin)  # positions: seq_lens - 1
        check_kv_store_args("decode_attention", new.k, new.v, k_pool, v_pool, new.slots)
        if new.slots.dtype != torch.int32:
            raise ValueError(f"decode_attention: new.slots must be int32, got {new.slots.dtype}")
        if k_scale is not None or not k_pool.is_floating_point():
            raise ValueError("decode_attention: new tokens need a float pool (int8: store_kv_int8 first)")
        check_row_norm("decode_attention", "new.norm.src", new.norm, bsz, q.dtype)
    if bsz == 0:
        return out
    quant = k_scale is not None
    cfg = decode_config(d, q.dtype, q.is_cuda, quant) | config
    ks = k_scale if quant else mid_lse  # any float32 tensor: the kernel does not read it
    vs = v_scale if quant else mid_lse
    group = hq // hkv
    block_d = max(16, next_pow2(d))
    direct = num_splits == 1
    fused = not direct and counts is not None
    if counts is not None and (counts.dtype != torch.int32 or counts.dim() != 1 or counts.numel() < bsz * hkv):
        raise ValueError(f"decode_attention: counts must be flat int32 of at least {bsz * hkv}")
    cnt = counts if fused else seq_lens  # any int32 tensor: the kernel does not touch it unless fused
    o, o_strides = (out, (out.stride(0), out.stride(1), 0)) if direct else (mid_o, mid_o.stride()[:3])
    # without new tokens, tensors of the same kinds: the kernel does not read them, and its
    # compiled form is the one the decode graphs (given new tokens) use
    kn, vn, cs, slots, norm = new if new is not None else (q, q, mid_lse, seq_lens, None)
    # without a norm, q stands in for its rows (not read: the width is 0)
    nrm, hidden, eps = (norm.src, norm.src.shape[1], norm.eps) if norm is not None else (q, 0, 0.0)
    _decode_split_launch[(bsz, hkv, num_splits)](
        q,
        k_pool,
        v_pool,
        ks,
        vs,
        req_table,
        rows,
        seq_lens,
        o,
        mid_lse,
        cnt,
        out,
        kn,
        vn,
        slots,
        cs,
        nrm,
        nrm.stride(0),
        hidden,
        eps,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        ks.stride(0),
        ks.stride(1),
        vs.stride(0),
        vs.stride(1),
        req_table.stride(0),
        *o_strides,
        mid_lse.stride(0),
        mid_lse.stride(1),
        out.stride(0),
        out.stride(1),
        kn.stride(0),
        kn.stride(1),
        vn.stride(0),
        vn.stride(1),
        cs.stride(0),
        scale * LOG2E,
        num_splits,
        split_tokens,
        int(new is not None),
        GROUP=group,
        HEAD_DIM=d,
        BLOCK_G=max(16, next_pow2(group)),
        BLOCK_D=block_d,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_S=COMBINE_SPLITS,
        NORM_BLOCK=NORM_BLOCK,
        QUANT=quant,
        IEEE=q.dtype == torch.float32,
        DIRECT=direct,
        FUSED=fused,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if direct or fused:
        return out
    _decode_reduce_launch[(bsz, hq)](
        mid_o,
        mid_lse,
        seq_lens,
        out,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        out.stride(0),
        out.stride(1),
        num_splits,
        split_tokens,
        HEAD_DIM=d,
        BLOCK_S=MAX_SPLITS,
        BLOCK_D=block_d,
        BLOCK_N=cfg["BLOCK_N"],
        num_warps=4,
    )
    return out
