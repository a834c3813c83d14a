"""Decode attention over the token KV pool: flash-decoding with split-K (the kernels are in
decode_split.py, stage 1, and decode_combine.py, stage 2; this is their checked wrapper).

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

from services.worker.kernels import decode_split
from services.worker.kernels.attention_args import check_pool, check_window_softcap
from services.worker.kernels.decode_combine import MAX_SPLITS, ScratchStrides, reduce_splits
from services.worker.kernels.kv_store import check_kv_store_args
from services.worker.kernels.launch import cdiv, next_pow2
from services.worker.kernels.rmsnorm import check_row_norm
from services.worker.kernels.rotary import check_rotary_args
from services.worker.kernels.strides import PoolStrides, ScaleStrides
from services.worker.models.layers.ops import RowNorm

LOG2E = 1.4426950408889634
# elements of a folded norm's residual row read at a time (row_inv_rms): the 8B shape's whole
# row in one load. A loop of smaller tiles waits for each tile's load before it asks for the
# next, a memory round trip each, on the path of every program. The same for every call, with
# or without a norm, so both run one compiled kernel.
NORM_BLOCK = 4096
# the last split's combine loads this many splits' partials at a time: a fixed tile, so one
# compiled kernel serves every split count
COMBINE_SPLITS = 8
# the fewest tokens a split of a request is given (see split_tokens). On an H200 (8B shape)
# the whole decode step, replayed from its graph, at batch 1 and context 1024 took 4.81 ms
# with 64 (16 splits) against 4.97 with 256 (4 splits), 4.85 with 128 and 4.81 with 32;
# batches of 8 or more gave the same at any of these, since their grid's split count, not
# this, bounds their splits (and from 64 requests it is one)
SPLIT_TOKENS = 64
# an e4m3 pool's dots in float16, not q's bfloat16: e4m3 converts to float16 in one instruction a
# pair (to bfloat16 through float16, a second a value), and both hold e4m3's values exactly;
# q and p are rounded to float16 (3 more bits than bfloat16), p times v's scale lifted by 2^8
# clear of float16's subnormals (so |v| must stay under 57,344, a scale of 2^7, and |q| under
# 65,504). Only quantized pools take it, which never fold a new token in (its k and v
# would be lifted too): those need a float pool.
F16_DOTS = True
# the batch from which an e4m3 pool's stage 1 runs narrower tiles (decode_config)
E4M3_NARROW_BATCH = 32


def decode_config(
    head_dim: int, dtype: torch.dtype, is_cuda: bool, quantized: bool = False, e4m3: bool = False, batch: int = 1
) -> dict[str, int]:
    """BLOCK_N / num_warps / num_stages of stage 1; small tiles in the interpreter keep tests fast.
    Measured on an H200 with 32 layers' pools replayed from a graph: bf16 / fp16 pools, 2 warps
    and 3 stages took a layer's attention at context 1024 from 267.5 to 247.7 µs at batch 256
    and 66.6 to 65.5 at batch 64, and gave the same or a little less at batches 1 and 4. An int8
    pool, 128-token tiles, 4 warps, 2 stages: 112 µs a layer at batch 64 and context 2048
    against 258 with 64 / 4 / 2; the fastest of 19 configs at batches 64 and 256, within 0.1 µs
    of the fastest at batch 1, and faster than the bf16 pool's kernel on the same requests. An
    e4m3 pool from E4M3_NARROW_BATCH requests: 64-token tiles, 2 warps, 4 stages, 59.1 µs a layer
    at batch 64 and context 1024 against 64.1 with the int8 pool's (H200, 27 launches swept);
    at batch 1 they were about 1 µs slower, so smaller batches keep the int8 pool's."""
    if not is_cuda:
        return {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32 or head_dim > 128:
        return {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    if quantized and e4m3 and batch >= E4M3_NARROW_BATCH:
        return {"BLOCK_N": 64, "num_warps": 2, "num_stages": 4}
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
    9.1 µs a layer, against 11.8 in its two-tile splits on an H200."""
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
    window: int = 0,
    softcap: float = 0.0,
    **config: int,
) -> torch.Tensor:
    """q: [B, Hq, D] one token per request; pools: [C, Hkv, D]; rows, seq_lens: [B] int32, seq_lens
    counting the new token (already stored). k_scale, v_scale [C, Hkv] float32 mark an int8 or e4m3 pool.
    num_splits is the grid's splits per request; a request whose context is short uses fewer,
    none of under split_tokens tokens (so one captured grid suits every context length).
    mid_o / mid_lse: scratch from decode_scratch (allocated when None). counts: int32 zeros, at
    least B * Hkv, left zero: with several splits, the last split of each (request, KV head)
    combines them, and the reduce kernel is not launched (without it, it is). new: the new
    tokens' k and v not yet in the pool (a float pool): the kernel rotates q (in registers, q
    itself is left as it is) and k, and stores k and v, as rotary_store_ would have before it;
    with new.norm it first scales q, k and v by their rows' inverse RMS (ops.RowNorm).
    window > 0: the query sees the last window positions only (the splits divide those);
    softcap > 0: each scaled score s becomes softcap * tanh(s / softcap) before the softmax.
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
    check_window_softcap("decode_attention", window, softcap)
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
            raise ValueError("decode_attention: new tokens need a float pool (int8, fp8: store_kv_quantized first)")
        check_row_norm("decode_attention", "new.norm.src", new.norm, bsz, q.dtype)
    if bsz == 0:
        return out
    quant = k_scale is not None
    cfg = decode_config(d, q.dtype, q.is_cuda, quant, k_pool.dtype == torch.float8_e4m3fn, bsz) | config
    ks = k_scale if quant else mid_lse  # any float32 tensor: the kernel does not read it
    vs = v_scale if quant else mid_lse
    group = hq // hkv
    direct = num_splits == 1
    fused = not direct and counts is not None
    if counts is not None and (counts.dtype != torch.int32 or counts.dim() != 1 or counts.numel() < bsz * hkv):
        raise ValueError(f"decode_attention: counts must be flat int32 of at least {bsz * hkv}")
    cnt = counts if fused else seq_lens  # any int32 tensor: the kernel does not touch it unless fused
    # with one split, stage 1 writes the output itself: its strides stand in for the scratch's
    o = out if direct else mid_o
    scratch = (
        ScratchStrides(out.stride(0), out.stride(1), 0, *mid_lse.stride()[:2])
        if direct
        else ScratchStrides.of(mid_o, mid_lse)
    )
    # without new tokens, tensors of the same kinds: the kernel does not read them, and its
    # compiled form is the one the decode graphs (given new tokens) use
    kn, vn, cs, slots, norm = new if new is not None else (q, q, mid_lse, seq_lens, None)
    # without a norm, q stands in for its rows (not read: the width is 0)
    nrm, hidden, eps = (norm.src, norm.src.shape[1], norm.eps) if norm is not None else (q, 0, 0.0)
    decode_split.split_launch[(bsz, hkv, num_splits)](
        q_ptr=q,
        k_ptr=k_pool,
        v_ptr=v_pool,
        ks_ptr=ks,
        vs_ptr=vs,
        table_ptr=req_table,
        rows_ptr=rows,
        lens_ptr=seq_lens,
        mid_o_ptr=o,
        mid_lse_ptr=mid_lse,
        cnt_ptr=cnt,
        out_ptr=out,
        kn_ptr=kn,
        vn_ptr=vn,
        slot_ptr=slots,
        cs_ptr=cs,
        nrm_ptr=nrm,
        nrm_b_stride=nrm.stride(0),
        hidden=hidden,
        nrm_eps=eps,
        q_b_stride=q.stride(0),
        q_h_stride=q.stride(1),
        **PoolStrides.of(k_pool, v_pool)._asdict(),
        **ScaleStrides.of(ks, vs)._asdict(),
        table_stride=req_table.stride(0),
        **scratch._asdict(),
        out_b_stride=out.stride(0),
        out_h_stride=out.stride(1),
        kn_b_stride=kn.stride(0),
        kn_h_stride=kn.stride(1),
        vn_b_stride=vn.stride(0),
        vn_h_stride=vn.stride(1),
        cs_row_stride=cs.stride(0),
        qk_scale=scale * LOG2E,
        num_splits=num_splits,
        split_tokens=split_tokens,
        rotary=int(new is not None),
        GROUP=group,
        HEAD_DIM=d,
        BLOCK_G=max(16, next_pow2(group)),
        BLOCK_D=max(16, next_pow2(d)),
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_S=COMBINE_SPLITS,
        NORM_BLOCK=NORM_BLOCK,
        QUANT=quant,
        IEEE=q.dtype == torch.float32,
        DIRECT=direct,
        FUSED=fused,
        WINDOW=window,
        SOFTCAP=float(softcap),
        F16=F16_DOTS and k_pool.dtype == torch.float8_e4m3fn and q.dtype != torch.float32,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if not (direct or fused):
        reduce_splits(mid_o, mid_lse, seq_lens, out, num_splits, split_tokens, cfg["BLOCK_N"], window)
    return out
