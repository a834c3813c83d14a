"""Decode attention's stage 1 (decode_attention.py has the wrapper that checks and launches it):
a program per (request, KV head, split) takes every query head of the KV head's GQA group and
one contiguous slice of the request's context, gathers the K/V rows through req_table[row, pos]
-> slot in BLOCK_N tiles, and writes the slice's normalised partial output and its log-sum-exp
(base 2), or, with one split, the output itself. Given a counter, the split that finishes last
combines the others' partials (decode_combine.combine_head). Given the new tokens as projected,
each split rotates q and the new k in registers and the request's last split stores k and v
in the pool and folds the token in before its KV loop. With a sliding window (WINDOW > 0) the
splits divide the last WINDOW positions only, so the positions the query does not see are never
read; a logit soft cap (SOFTCAP > 0) caps the scores as extend attention does. Both are
compile-time switches, off (0) for the families that use neither.
"""

from __future__ import annotations

import triton
import triton.language as tl

from services.worker.kernels.decode_combine import combine_head, tokens_per_split, visible_len
from services.worker.kernels.extend_attention import dot, online_softmax_step, softcap_scores
from services.worker.kernels.kv_scale import load_kv_scale
from services.worker.kernels.launch import launcher
from services.worker.kernels.rmsnorm import row_inv_rms
from services.worker.kernels.rotary import load_cos_sin, load_halves, rotate_loaded


# Not specialised on what changes between the decode graphs' calls and those of steps with
# prompt tokens (eager attention), so that the latter run kernels the graphs' capture compiled:
# the split count, and the scratch's strides, which follow it; the new tokens' flag and
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
        "ks_head_stride",
        "vs_slot_stride",
        "vs_head_stride",
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
    kp_slot_stride,
    kp_head_stride,
    vp_slot_stride,
    vp_head_stride,
    ks_slot_stride,
    ks_head_stride,
    vs_slot_stride,
    vs_head_stride,
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
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    F16: tl.constexpr = False,
    P_LIFT: tl.constexpr = 256.0,
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
    span = visible_len(seq_len, WINDOW)  # the query sees positions [seq_len - span, seq_len)
    split_len = tokens_per_split(span, num_splits, split_tokens, BLOCK_N)
    begin = split * split_len
    if WINDOW > 0:
        begin += seq_len - span
    if not DIRECT:  # noqa: SIM102 (a compile-time branch: Triton drops it whole for DIRECT)
        if begin >= seq_len:
            if FUSED:  # noqa: SIM102
                if seq_len == 0 and split == 0:  # an empty request: the combine of no splits, zeros
                    for g in tl.static_range(GROUP):
                        combine_head(
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
            kp_slot_stride,
            kp_head_stride,
            vp_slot_stride,
            vp_head_stride,
            qk_scale,
            offs_d,
            half,
            SOFTCAP,
        )
        pool_end = tl.minimum(end, seq_len - 1)  # the new token is in already
    else:
        q = tl.load(q_rows + offs_d[None, :], mask=qmask, other=0.0)  # [BLOCK_G, BLOCK_D]
        pool_end = end
    # the dots' operand type: q's, or float16 for an e4m3 pool (F16), p times v's scale lifted by
    # P_LIFT clear of float16's subnormals and the output brought back after the loop
    q_dot = q.to(tl.float16) if F16 else q
    v_lift = P_LIFT if F16 else 1.0
    for start in range(begin, pool_end, BLOCK_N):
        pos = start + offs_n
        nmask = pos < pool_end
        slots = tl.load(table_ptr + row * table_stride + pos, mask=nmask, other=0).to(tl.int64)  # [BLOCK_N]
        kv_mask = nmask[:, None] & dmask[None, :]
        k = tl.load(
            k_ptr + slots[:, None] * kp_slot_stride + kvh * kp_head_stride + offs_d[None, :], mask=kv_mask, other=0.0
        )
        v = tl.load(
            v_ptr + slots[:, None] * vp_slot_stride + kvh * vp_head_stride + offs_d[None, :], mask=kv_mask, other=0.0
        )
        if QUANT:
            k_s = load_kv_scale(ks_ptr, slots, ks_slot_stride, kvh, ks_head_stride, nmask)
            v_s = load_kv_scale(vs_ptr, slots, vs_slot_stride, kvh, vs_head_stride, nmask)
            qk = dot(q_dot, tl.trans(k.to(q_dot.dtype)), IEEE) * k_s[None, :]  # [BLOCK_G, BLOCK_N]
            v_s = v_s * v_lift
        else:
            v_s = None
            qk = dot(q, tl.trans(k), IEEE)
        if SOFTCAP > 0:
            qk = softcap_scores(qk, qk_scale, SOFTCAP)
        qk = tl.where(nmask[None, :], qk, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, qk, qk_scale, v, v_s, q_dot.dtype, QUANT, IEEE)
    acc = acc * (1.0 / v_lift)

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
            used = tl.cdiv(span, split_len)
            if tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == used - 1:
                tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")  # ready for the next launch
                for g in tl.static_range(GROUP):
                    combine_head(
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
    kp_head_stride,
    vp_slot_stride,
    vp_head_stride,
    qk_scale,
    offs_d,
    HALF: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """The request's new token (k rotated, k and v scaled by the folded norm's factor, [BLOCK_D]),
    for its last split (last; other splits get their state back as it was): k and v stored in
    the pool at slot, and the token folded into the running softmax as online_softmax_step folds
    a tile (p rounded to q's dtype for the sum)."""
    store = offs_d < tl.where(last, 2 * HALF, 0)  # the whole head in the last split, else nothing
    tl.store(kp_ptr + slot * kp_slot_stride + kvh * kp_head_stride + offs_d, k.to(kp_ptr.dtype.element_ty), mask=store)
    tl.store(vp_ptr + slot * vp_slot_stride + kvh * vp_head_stride + offs_d, v.to(vp_ptr.dtype.element_ty), mask=store)
    qk = tl.sum(q.to(tl.float32) * k.to(tl.float32)[None, :], axis=1)  # [BLOCK_G]
    if SOFTCAP > 0:
        qk = softcap_scores(qk, qk_scale, SOFTCAP)
    qk = tl.where(last, qk * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, qk)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p.to(q.dtype).to(tl.float32)[:, None] * v.to(tl.float32)[None, :]
    return acc, m_new, l_i


split_launch = launcher(_decode_split_kernel)
