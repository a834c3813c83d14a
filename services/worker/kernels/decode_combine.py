"""Decode attention's combine: each (request, query head)'s split partial outputs weighed by
their log-sum-exps (base 2) into its output. combine_head is shared by the reduce kernel here
(a launch after stage 1) and stage 1's last split (decode_split.py), which combines in place
when given a counter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import launcher, next_pow2

MAX_SPLITS = 32


@triton.jit
def visible_len(seq_len, WINDOW: tl.constexpr):
    """How many of its seq_len positions a decode's query (at seq_len - 1) sees: all, or with a
    sliding window (WINDOW > 0) the last WINDOW. The splits divide these."""
    if WINDOW > 0:
        return tl.minimum(seq_len, WINDOW)
    else:
        return seq_len


@triton.jit
def tokens_per_split(seq_len, num_splits, split_tokens, BLOCK_N: tl.constexpr):
    """Tokens per split of one request: its context over the splits it uses, at most
    num_splits (the grid's) and fewer for a short context, so no split has much under
    split_tokens; whole tiles each. Splits past the last used one find nothing to do."""
    used = tl.maximum(tl.minimum(num_splits, tl.cdiv(seq_len, split_tokens)), 1)
    return tl.cdiv(tl.cdiv(seq_len, used), BLOCK_N) * BLOCK_N


@triton.jit
def combine_head(
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
    WINDOW: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    span = visible_len(tl.load(lens_ptr + b), WINDOW)
    split_len = tokens_per_split(span, num_splits, split_tokens, BLOCK_N)
    # the splits stage 1 ran, recomputed (none for an empty request, whose split_len is 0)
    used = tl.where(span > 0, tl.minimum(num_splits, tl.cdiv(span, tl.maximum(split_len, 1))), 0)
    combine_head(
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


class ScratchStrides(NamedTuple):
    """Strides of the split scratch: partial outputs [B, Hq, splits, D] (the output's [B, Hq, D]
    with a split stride of 0 where stage 1 writes the output itself) and log-sum-exps [B, Hq, splits]."""

    o_b_stride: int
    o_h_stride: int
    o_s_stride: int
    lse_b_stride: int
    lse_h_stride: int

    @classmethod
    def of(cls, mid_o: torch.Tensor, mid_lse: torch.Tensor) -> ScratchStrides:
        return cls(*mid_o.stride()[:3], *mid_lse.stride()[:2])


def reduce_splits(
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    num_splits: int,
    split_tokens: int,
    block_n: int,
    window: int = 0,
) -> None:
    """out [B, Hq, D] = the combine of stage 1's partials mid_o [B, Hq, splits, D] and mid_lse
    [B, Hq, splits] (checked by decode_attention); num_splits, split_tokens, block_n and window
    as stage 1 ran, so the splits it used are recomputed from seq_lens [B]."""
    bsz, hq, _, d = mid_o.shape
    _decode_reduce_launch[(bsz, hq)](
        mid_o_ptr=mid_o,
        mid_lse_ptr=mid_lse,
        lens_ptr=seq_lens,
        out_ptr=out,
        **ScratchStrides.of(mid_o, mid_lse)._asdict(),
        out_b_stride=out.stride(0),
        out_h_stride=out.stride(1),
        num_splits=num_splits,
        split_tokens=split_tokens,
        HEAD_DIM=d,
        BLOCK_S=MAX_SPLITS,
        BLOCK_D=max(16, next_pow2(d)),
        BLOCK_N=block_n,
        WINDOW=window,
        num_warps=4,
    )
