"""Extend (prefill) attention: packed new tokens attend causally to their request's prefix in
the KV pool and to each other. FlashAttention-2 forward with an online softmax.

The grid is (query blocks, query heads, segments). A program holds BLOCK_M queries of one
head in registers and streams keys in BLOCK_N tiles, in three loops:
  1. the prefix (positions [0, prefix_len)), gathered from the pool through req_table;
  2. new tokens before the block's diagonal: visible to every query, so no mask at all;
  3. the diagonal tiles, the only ones that need the causal mask.
Tiles above the diagonal are never visited. With a sliding window (WINDOW > 0: a query at
position p sees keys in (p - WINDOW, p]) the first two loops start at the tile holding the
oldest key the block's first query sees, and the window is masked in the tiles visited. A
logit soft cap (SOFTCAP > 0) maps each scaled score s to SOFTCAP * tanh(s / SOFTCAP) before
the mask and the softmax. Both are compile-time switches: without them (0) the kernel is the
plain causal one. Scores are scaled by scale * log2(e) so the softmax uses exp2; accumulators
are float32, tl.dot inputs the activation dtype. Query blocks are numbered from the end so the
longest (latest) blocks start first, which shortens the tail of a causal launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.attention_args import check_pool, check_window_softcap
from services.worker.kernels.kv_scale import load_kv_scale
from services.worker.kernels.launch import cdiv, launcher, next_pow2
from services.worker.kernels.strides import PoolStrides, ScaleStrides

LOG2E = 1.4426950408889634
_LOG2E: tl.constexpr = tl.constexpr(LOG2E)


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b; float32 inputs use exact IEEE products instead of TF32."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def softcap_scores(qk, qk_scale, SOFTCAP: tl.constexpr):
    """Raw scores qk [.., N] soft-capped as Hugging Face caps the scaled ones, s -> SOFTCAP *
    tanh(s / SOFTCAP) with s = scale * qk, and divided by scale again, so that the softmax's
    scaling by qk_scale (scale * log2(e)) applies as to uncapped scores. tanh(x) is computed
    as 2 sigmoid(2x) - 1 (no tanh in every Triton backend)."""
    scale = qk_scale / _LOG2E
    t = 2.0 * tl.sigmoid(qk * (2.0 * scale / SOFTCAP)) - 1.0
    return t * (SOFTCAP / scale)


@triton.jit
def online_softmax_step(
    acc, m_i, l_i, qk, qk_scale, v, v_scale, DTYPE: tl.constexpr, QUANT: tl.constexpr, IEEE: tl.constexpr
):
    """Fold one tile into the running softmax. qk: [M, N] raw scores (-inf where masked), scaled
    here by qk_scale = scale * log2(e) inside one FMA; v: [N, D]; v_scale: [N] per-token scales
    of an int8 v (QUANT), else unused. m_i and l_i are in the log2 domain."""
    m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(qk * qk_scale - m_new[:, None])  # [M, N]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if QUANT:
        # scaling p by each token's scale is the same as dequantizing v's rows
        p = p * v_scale[None, :]
        v = v.to(DTYPE)
    if IEEE:
        acc = tl.dot(p.to(DTYPE), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(DTYPE), v, acc)
    return acc, m_new, l_i


@triton.jit
def _load(ptrs, row_mask, col_mask, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a [rows, D] tile with only the masks it needs: an all-true mask still costs
    vector width in compiled code."""
    if MASK_ROWS and MASK_COLS:
        return tl.load(ptrs, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
    elif MASK_ROWS:
        return tl.load(ptrs, mask=row_mask[:, None], other=0.0)
    elif MASK_COLS:
        return tl.load(ptrs, mask=col_mask[None, :], other=0.0)
    else:
        return tl.load(ptrs)


# num_m_blocks changes with every batch: specialising on it (1, a multiple of 16, other) made
# a fresh worker compile again, 1.5 s, for the first batch whose block count divided by 16
@triton.jit(do_not_specialize=["num_m_blocks"])
def _extend_kernel(
    q_ptr,
    kn_ptr,
    vn_ptr,
    kp_ptr,
    vp_ptr,
    ks_ptr,
    vs_ptr,
    table_ptr,
    rows_ptr,
    starts_ptr,
    lens_ptr,
    prefix_ptr,
    out_ptr,
    q_t_stride,
    q_h_stride,
    kn_t_stride,
    kn_h_stride,
    vn_t_stride,
    vn_h_stride,
    kp_slot_stride,
    kp_head_stride,
    vp_slot_stride,
    vp_head_stride,
    ks_slot_stride,
    ks_head_stride,
    vs_slot_stride,
    vs_head_stride,
    table_stride,
    out_t_stride,
    out_h_stride,
    qk_scale,
    num_m_blocks,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAD_D: tl.constexpr,
    QUANT: tl.constexpr,
    IEEE: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    m_block = num_m_blocks - 1 - tl.program_id(0)
    h = tl.program_id(1)
    seg = tl.program_id(2)
    ext_len = tl.load(lens_ptr + seg)
    m0 = m_block * BLOCK_M
    if m0 >= ext_len:
        return
    start = tl.load(starts_ptr + seg).to(tl.int64)
    prefix_len = tl.load(prefix_ptr + seg)
    row = tl.load(rows_ptr + seg).to(tl.int64)
    kvh = h // GROUP

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mmask = offs_m < ext_len
    dmask = offs_d < HEAD_DIM
    q_ptrs = q_ptr + (start + offs_m)[:, None] * q_t_stride + h * q_h_stride + offs_d[None, :]
    q = _load(q_ptrs, mmask, dmask, True, PAD_D)  # [BLOCK_M, BLOCK_D]

    # a finite floor instead of -inf keeps exp2(m_old - m_new) at 0, never NaN
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if WINDOW > 0:
        # the oldest key the block's first query sees (absolute position), and the tiles of the
        # prefix and of the new tokens that hold it: those before are skipped
        oldest = prefix_len + m0 - WINDOW + 1
        prefix_from = tl.maximum(oldest, 0) // BLOCK_N * BLOCK_N
        new_from = tl.maximum(oldest - prefix_len, 0) // BLOCK_N * BLOCK_N
    else:
        prefix_from = 0
        new_from = 0

    # 1. the prefix, gathered from the pool by slot
    kp_base = kp_ptr + kvh * kp_head_stride + offs_d[None, :]
    vp_base = vp_ptr + kvh * vp_head_stride + offs_d[None, :]
    for n in range(prefix_from, prefix_len, BLOCK_N):
        pos = n + offs_n
        nmask = pos < prefix_len
        slots = tl.load(table_ptr + row * table_stride + pos, mask=nmask, other=0).to(tl.int64)  # [BLOCK_N]
        k = _load(kp_base + slots[:, None] * kp_slot_stride, nmask, dmask, True, PAD_D)  # [BLOCK_N, BLOCK_D]
        v = _load(vp_base + slots[:, None] * vp_slot_stride, nmask, dmask, True, PAD_D)
        if QUANT:
            k_s = load_kv_scale(ks_ptr, slots, ks_slot_stride, kvh, ks_head_stride, nmask)
            v_s = load_kv_scale(vs_ptr, slots, vs_slot_stride, kvh, vs_head_stride, nmask)
            qk = dot(q, tl.trans(k.to(q.dtype)), IEEE) * k_s[None, :]  # [BLOCK_M, BLOCK_N]
        else:
            v_s = None
            qk = dot(q, tl.trans(k), IEEE)
        if SOFTCAP > 0:
            qk = softcap_scores(qk, qk_scale, SOFTCAP)
        if WINDOW > 0:
            seen = nmask[None, :] & (pos[None, :] > (prefix_len + offs_m)[:, None] - WINDOW)
            qk = tl.where(seen, qk, float("-inf"))
        else:
            qk = tl.where(nmask[None, :], qk, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, qk, qk_scale, v, v_s, q.dtype, QUANT, IEEE)

    # 2. new tokens before the diagonal: every query of the block sees all of them (in its window)
    kn_base = kn_ptr + start * kn_t_stride + kvh * kn_h_stride + offs_d[None, :]
    vn_base = vn_ptr + start * vn_t_stride + kvh * vn_h_stride + offs_d[None, :]
    for n in range(new_from, m0, BLOCK_N):
        pos = n + offs_n
        k = _load(kn_base + pos[:, None] * kn_t_stride, pos, dmask, False, PAD_D)  # [BLOCK_N, BLOCK_D]
        v = _load(vn_base + pos[:, None] * vn_t_stride, pos, dmask, False, PAD_D)
        qk = dot(q, tl.trans(k), IEEE)
        if SOFTCAP > 0:
            qk = softcap_scores(qk, qk_scale, SOFTCAP)
        if WINDOW > 0:
            qk = tl.where(pos[None, :] > offs_m[:, None] - WINDOW, qk, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, qk, qk_scale, v, None, q.dtype, False, IEEE)

    # 3. the diagonal tiles: causal mask (and the window's), and the end of the segment
    for n in range(m0, tl.minimum(m0 + BLOCK_M, ext_len), BLOCK_N):
        pos = n + offs_n
        nmask = pos < ext_len
        k = _load(kn_base + pos[:, None] * kn_t_stride, nmask, dmask, True, PAD_D)
        v = _load(vn_base + pos[:, None] * vn_t_stride, nmask, dmask, True, PAD_D)
        qk = dot(q, tl.trans(k), IEEE)
        if SOFTCAP > 0:
            qk = softcap_scores(qk, qk_scale, SOFTCAP)
        seen = (pos[None, :] <= offs_m[:, None]) & nmask[None, :]
        if WINDOW > 0:
            seen = seen & (pos[None, :] > offs_m[:, None] - WINDOW)
        qk = tl.where(seen, qk, float("-inf"))
        acc, m_i, l_i = online_softmax_step(acc, m_i, l_i, qk, qk_scale, v, None, q.dtype, False, IEEE)

    o = acc / l_i[:, None]
    out_ptrs = out_ptr + (start + offs_m)[:, None] * out_t_stride + h * out_h_stride + offs_d[None, :]
    tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & dmask[None, :])


_extend_launch = launcher(_extend_kernel)

# (BLOCK_M, BLOCK_N, num_warps, num_stages) on CUDA, by padded head dim, for 16-bit and float32 inputs
_CUDA_16BIT = {16: (128, 64, 4, 3), 32: (128, 64, 4, 3), 64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}
_CUDA_FP32 = {16: (64, 32, 4, 2), 32: (64, 32, 4, 2), 64: (64, 32, 4, 2), 128: (32, 32, 4, 2), 256: (32, 16, 4, 1)}
# segments up to this long use _CUDA_16BIT_SHORT for head_dim 128: on an H200 (sweep of
# tools/bench_kernels.py, causal, 4096 tokens) 64x64 tiles with 4 warps ran 395 TFLOP/s
# against 384 for 128x64 with 8 warps, and waste less on the ragged ends of short prompts
SHORT_EXTEND = 4096
_CUDA_16BIT_SHORT = {128: (64, 64, 4, 3)}
# the interpreter: small tiles so the tests' short segments still cross several blocks
_INTERPRETER = (32, 16, 4, 1)


def extend_config(head_dim: int, dtype: torch.dtype, is_cuda: bool, max_len: int = 0) -> dict[str, int]:
    """Launch config for (head_dim, dtype, device, longest segment); a fixed table, no autotuning
    at serving time."""
    block_d = max(16, next_pow2(head_dim))
    if not is_cuda:
        cfg = _INTERPRETER
    elif dtype != torch.float32 and max_len <= SHORT_EXTEND and block_d in _CUDA_16BIT_SHORT:
        cfg = _CUDA_16BIT_SHORT[block_d]
    else:
        table = _CUDA_FP32 if dtype == torch.float32 else _CUDA_16BIT
        cfg = table.get(block_d, table[256])
    return dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), cfg, strict=True))


def extend_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    req_table: torch.Tensor,
    rows: torch.Tensor,
    starts: torch.Tensor,
    extend_lens: torch.Tensor,
    prefix_lens: torch.Tensor,
    max_extend_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    window: int = 0,
    softcap: float = 0.0,
    **config: int,
) -> torch.Tensor:
    """q: [E, Hq, D] packed extend tokens; k_new, v_new: [E, Hkv, D] their K/V; pools: [C, Hkv, D]
    holding each segment's prefix at req_table[row, 0:prefix_len]; rows, starts, extend_lens,
    prefix_lens: [Be] int32; max_extend_len >= every extend_lens. k_scale, v_scale [C, Hkv]
    float32 mark an int8 or e4m3 pool (the prefix only: k_new / v_new are in q's dtype). window > 0: a
    query at position p sees keys in (p - window, p] only; softcap > 0: each scaled score s
    becomes softcap * tanh(s / softcap) before the softmax. config overrides BLOCK_M / BLOCK_N /
    num_warps / num_stages. Returns out [E, Hq, D]."""
    if q.dim() != 3 or q.stride(-1) != 1:
        raise ValueError(f"extend_attention: q must be [E, Hq, D] with a contiguous last dim, got {tuple(q.shape)}")
    e, hq, d = q.shape
    hkv = check_pool("extend_attention", q, k_pool, v_pool, k_scale, v_scale)
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if x.shape != (e, hkv, d) or x.dtype != q.dtype or x.stride(-1) != 1:
            raise ValueError(f"extend_attention: {name} must be [{e}, {hkv}, {d}] {q.dtype}, contiguous last dim")
    be = rows.shape[0]
    for name, x in (("rows", rows), ("starts", starts), ("extend_lens", extend_lens), ("prefix_lens", prefix_lens)):
        if x.shape != (be,) or x.dtype != torch.int32:
            raise ValueError(f"extend_attention: {name} must be [{be}] int32, got {tuple(x.shape)} {x.dtype}")
    if req_table.dim() != 2 or req_table.dtype != torch.int32 or req_table.stride(-1) != 1:
        raise ValueError("extend_attention: req_table must be a 2-d int32 tensor with a contiguous last dim")
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"extend_attention: out must be {tuple(q.shape)} {q.dtype} with a contiguous last dim")
    check_window_softcap("extend_attention", window, softcap)
    if be == 0 or e == 0 or max_extend_len <= 0:
        return out
    cfg = extend_config(d, q.dtype, q.is_cuda, max_extend_len) | config
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if block_m % block_n:
        raise ValueError(f"extend_attention: BLOCK_M {block_m} must be a multiple of BLOCK_N {block_n}")
    quant = k_scale is not None
    ks = k_scale if quant else rows[:, None]  # any 2-d tensor: the kernel does not read it
    vs = v_scale if quant else rows[:, None]
    num_m_blocks = cdiv(max_extend_len, block_m)
    block_d = max(16, next_pow2(d))
    _extend_launch[(num_m_blocks, hq, be)](
        q_ptr=q,
        kn_ptr=k_new,
        vn_ptr=v_new,
        kp_ptr=k_pool,
        vp_ptr=v_pool,
        ks_ptr=ks,
        vs_ptr=vs,
        table_ptr=req_table,
        rows_ptr=rows,
        starts_ptr=starts,
        lens_ptr=extend_lens,
        prefix_ptr=prefix_lens,
        out_ptr=out,
        q_t_stride=q.stride(0),
        q_h_stride=q.stride(1),
        kn_t_stride=k_new.stride(0),
        kn_h_stride=k_new.stride(1),
        vn_t_stride=v_new.stride(0),
        vn_h_stride=v_new.stride(1),
        **PoolStrides.of(k_pool, v_pool)._asdict(),
        **ScaleStrides.of(ks, vs)._asdict(),
        table_stride=req_table.stride(0),
        out_t_stride=out.stride(0),
        out_h_stride=out.stride(1),
        qk_scale=scale * LOG2E,
        num_m_blocks=num_m_blocks,
        GROUP=hq // hkv,
        HEAD_DIM=d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        PAD_D=block_d != d,
        QUANT=quant,
        IEEE=q.dtype == torch.float32,
        WINDOW=window,
        SOFTCAP=float(softcap),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return out
