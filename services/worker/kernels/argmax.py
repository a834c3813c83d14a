"""Argmax of each row of the logits [S, V]: a greedy step's token choice, split over the row.

PyTorch's argmax reduces a row in one thread block: on an H200 a row of Llama 3's 128,256
logits took 27.5 µs at batch 1 and 40 µs at batch 64, longer than
the rest of the step outside its CUDA graph. Here stage 1 runs a program per (row, split),
each scanning its share of the row in BLOCK-wide tiles and keeping a running maximum and its
first index per lane; it writes its split's maximum and index. Stage 2 (a program a row) takes
the largest over the splits, the first on ties. With one split per row (batches that give
enough programs on their own) stage 1 writes the result and stage 2 is not launched.

Ties go to the lowest index, as torch.argmax does. NaN counts as the smallest value (torch
would return its index).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher, next_pow2

BLOCK = 1024
# 8 warps: each thread loads one 16-byte vector of a float32 tile. With 4 (two vectors a thread)
# 64 rows of 128,256 logits took 29.8 µs, with 8 12.4 µs, and one row 6.2 and 3.3 µs
# (a sweep of tiles 1024-4096, 4 or 8 warps, 4-32 programs an SM, on an H200)
WARPS = 8
MAX_SPLITS = 64
_NO_INDEX = 2**31 - 1


@triton.jit(do_not_specialize=["x_row_stride", "n_cols", "chunk"])
def _argmax_split_kernel(
    x_ptr,
    val_ptr,
    idx_ptr,
    x_row_stride,
    n_cols,
    chunk,
    splits,
    NO_INDEX: tl.constexpr,
    BLOCK: tl.constexpr,
    WRITE_VAL: tl.constexpr,
):
    """WRITE_VAL false (one split a row): only the index is written, at idx_ptr[row]."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    begin = split * chunk
    end = tl.minimum(begin + chunk, n_cols)
    offs = tl.arange(0, BLOCK)
    best_v = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    best_i = tl.full([BLOCK], NO_INDEX, dtype=tl.int32)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    for start in range(begin, end, BLOCK):
        cols = start + offs
        mask = cols < end
        v = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        v = tl.where(v == v, v, float("-inf"))  # NaN compares as the smallest
        # a lane's first element is taken even at -inf, so a row of -inf still names an index;
        # later ones only when strictly larger: the first of equal values stays
        take = mask & ((v > best_v) | (best_i == NO_INDEX))
        best_v = tl.where(take, v, best_v)
        best_i = tl.where(take, cols, best_i)
    m = tl.max(best_v, axis=0)
    i = tl.min(tl.where(best_v == m, best_i, NO_INDEX), axis=0)
    if WRITE_VAL:
        tl.store(val_ptr + row * splits + split, m)
    tl.store(idx_ptr + row * splits + split, i.to(idx_ptr.dtype.element_ty))


@triton.jit
def _argmax_combine_kernel(val_ptr, idx_ptr, out_ptr, splits, NO_INDEX: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_S)
    valid = offs < splits
    v = tl.load(val_ptr + row * splits + offs, mask=valid, other=float("-inf"))
    i = tl.load(idx_ptr + row * splits + offs, mask=valid, other=NO_INDEX)
    m = tl.max(v, axis=0)
    # the splits cover the row in order: the smallest index among the maxima is the first
    best = tl.min(tl.where(valid & (v == m) & (i != NO_INDEX), i, NO_INDEX), axis=0)
    tl.store(out_ptr + row, best.to(out_ptr.dtype.element_ty))


_split_launch = launcher(_argmax_split_kernel)
_combine_launch = launcher(_argmax_combine_kernel)


def num_splits(rows: int, cols: int, num_sms: int) -> int:
    """Splits per row: about eight programs an SM in all, none with under two tiles to scan. A
    program's scan is bound by its loads' latency, not by bandwidth: with two programs an SM,
    64 rows of 128,256 logits took 80 µs on an H200."""
    return max(1, min(cdiv(8 * num_sms, max(rows, 1)), cols // (2 * BLOCK), MAX_SPLITS))


def argmax_rows(x: torch.Tensor, num_sms: int = 132) -> torch.Tensor:
    """x: [S, V] float (any float dtype), last dim contiguous -> [S] int64, each row's argmax."""
    if x.dim() != 2 or x.stride(-1) != 1 or not x.is_floating_point():
        raise ValueError(f"argmax_rows: x must be a float [S, V] with a contiguous last dim, got {tuple(x.shape)}")
    rows, cols = x.shape
    if cols == 0:
        raise ValueError("argmax_rows: rows of no columns have no argmax")
    if cols >= _NO_INDEX:
        raise ValueError(f"argmax_rows: at most {_NO_INDEX - 1} columns, got {cols}")
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    block = min(BLOCK, next_pow2(cols))
    splits = num_splits(rows, cols, num_sms)
    chunk = cdiv(cdiv(cols, splits), block) * block
    splits = cdiv(cols, chunk)  # none empty
    if splits == 1:
        _split_launch[(rows, 1)](
            x, out, out, x.stride(0), cols, chunk, 1, NO_INDEX=_NO_INDEX, BLOCK=block, WRITE_VAL=False, num_warps=WARPS
        )
        return out
    vals = torch.empty(rows, splits, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, splits, dtype=torch.int32, device=x.device)
    _split_launch[(rows, splits)](
        x, vals, idx, x.stride(0), cols, chunk, splits, NO_INDEX=_NO_INDEX, BLOCK=block, WRITE_VAL=True, num_warps=WARPS
    )
    _combine_launch[(rows,)](vals, idx, out, splits, NO_INDEX=_NO_INDEX, BLOCK_S=next_pow2(splits), num_warps=1)
    return out
