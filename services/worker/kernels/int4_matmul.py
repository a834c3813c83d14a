"""Weight-only int4 matmul: x [M, K] @ W.t() with W an Int4Weight (models/int4_weight.py),
dequantized in registers, tile by tile, and never written out.

Each program computes a [BLOCK_M, BLOCK_N] tile of the output over its share of K in BLOCK_K
steps; BLOCK_K divides the group size, so a step reads one row of scales and zero points. A step
loads its packed words once ([BLOCK_K / 8, BLOCK_N] int32: eight input rows a word), shifts
each into its eight 4-bit values and lays them out as [BLOCK_K, BLOCK_N]; (q - zero) * scale is
computed in float32 and rounded to x's dtype, as the reference (``int4_reference``) dequantizes
before its matmul; products accumulate in float32 (IEEE for float32 inputs, not TF32). A Tile
with dot=False (at most FMA_MAX_M rows: BLOCK_M the batch rounded up to a power of two, not a
dot operand's 16) replaces the dot by an FMA reduction: q - zero in float32 times each row of x,
summed over the step, times the step's scales (a step lies in one group); its q - zero comes
without an int-to-float conversion: a nibble OR-ed into the bits of 2^23 (0x4B000000) is the
float32 2^23 + q, less 2^23 + zero, exactly (on the H200 at M = 1: 3.54 to 3.36 ms a decode step;
the dot path did not gain from it). At one row the FMA path takes each nibble where it lies in its
word instead (in_place_nibbles: no shift a weight) and sums the step's K within each thread; and
one row of bfloat16 x on a GPU takes packed pairs instead (int4_pairs.py: two weights an
instruction, 3.41 to 2.84 ms an AWQ decode step at batch 1 on an H100).

At decode sizes (M of 1 to 64) the product is a read of the packed weight, and its output tiles
are too few to fill a GPU (Llama-3-8B's down projection: 64 tiles of 64 columns on an H200's 132
SMs). So K is cut into shares (split_k_sum.py's choose_split: several programs on every SM at a
batch of one, fewer as M grows) whose float32 sums split_k_sum adds; an unsplit product writes
its output directly. The tile, warps, stages and split are a Tile (gemm_tiles.py): the caller's,
else INT4_TILES' entry for the shape and batch when its BLOCK_K divides the weight's group size,
else INT4_DEFAULT (its BLOCK_K cut to the group size when the group is smaller).
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from services.worker.kernels.gemm_tiles import INT4_DEFAULT, INT4_TILES, Tile, check_rows, lookup
from services.worker.kernels.int4_pairs import pairs_step
from services.worker.kernels.launch import launcher
from services.worker.kernels.split_k_sum import plan_split, split_k_sum
from services.worker.models.int4_weight import Int4Weight

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PAIRS = True  # one row of 16-bit x in packed pairs where it can (pairs_mode)


@triton.jit
def _int4_matmul_kernel(
    x_ptr,
    qw_ptr,
    z_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    x_row_stride,
    out_row_stride,
    share_stride,
    k_per_share,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PARTIAL: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    IEEE: tl.constexpr,
    DOT: tl.constexpr,
    PAIRS: tl.constexpr = 0,  # one row of 16-bit x in packed pairs (int4_pairs.py): 1 in PTX, 2 emulated
    MAGIC: tl.constexpr = 8388608.0,  # 2^23, whose float32 bits are 0x4B000000
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_w = tl.arange(0, BLOCK_K // 8)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_lo = tl.program_id(2) * k_per_share
    k_hi = tl.minimum(k_lo + k_per_share, K)
    dtype = x_ptr.dtype.element_ty
    shifts = (tl.arange(0, 8) * 4)[None, :, None]  # [1, 8, 1]: input row 8i + j at bits 4j
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * x_row_stride + offs_k[None, :]
    qw_ptrs = qw_ptr + offs_w[:, None].to(tl.int64) * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    rows = tl.arange(0, BLOCK_M)
    offs_x = offs_w[:, None] * 8 + tl.arange(0, 8)[None, :]  # [BLOCK_K / 8, 8]: input 8i + j
    for k0 in range(k_lo, k_hi, BLOCK_K):
        packed = tl.load(qw_ptrs + (k0 // 8) * N, mask=mask_n[None, :], other=0)  # [BLOCK_K / 8, BLOCK_N]
        g = k0 // GROUP
        z = tl.load(z_ptr + g * N + offs_n, mask=mask_n, other=0).to(tl.int32)
        s = tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        if DOT:
            a = tl.load(x_ptrs + k0, mask=mask_m[:, None], other=0.0)
            q = tl.reshape((packed[:, None, :] >> shifts) & 0xF, (BLOCK_K, BLOCK_N))
            w = ((q - z[None, :]).to(tl.float32) * s[None, :]).to(dtype)
            if IEEE:
                acc += tl.dot(a, w, input_precision="ieee")
            else:
                acc += tl.dot(a, w)
        elif PAIRS:
            x_words = x_ptr.to(tl.pointer_type(tl.int32)) + (tl.program_id(0) * x_row_stride + k0) // 2 + offs_w * 4
            acc += (pairs_step(packed, z, x_words, dtype == tl.bfloat16, PAIRS == 1) * s)[None, :]
        elif BLOCK_M == 1:
            # one row: the step's sum over K stays in each thread's rows (in_place_nibbles)
            x_row = x_ptr + tl.program_id(0).to(tl.int64) * x_row_stride + k0 + offs_w * 8
            acc += (in_place_nibbles(packed, z.to(tl.float32), x_row) * s)[None, :]
        else:
            # FMA: q - zero stays [BLOCK_K / 8, 8, BLOCK_N] in float32 (no reshape, no rounding to
            # x's dtype); each token row times it, summed over K, then times the step's one row of
            # scales (a step lies in one group), into its row of acc (a row past M reads row
            # M - 1, whose sum is not stored: the loads need no row mask)
            # 2^23 + zero as float32: a nibble OR-ed into 2^23's bits (0x4B000000) is 2^23 + q,
            # and their difference is q - zero, exact, with no int-to-float conversion a weight
            nib = ((packed[:, None, :] >> shifts) & 0xF) | 0x4B000000  # [BLOCK_K / 8, 8, BLOCK_N]
            w3 = nib.to(tl.float32, bitcast=True) - (z.to(tl.float32) + MAGIC)[None, None, :]
            for i in tl.static_range(BLOCK_M):
                row = tl.minimum(tl.program_id(0) * BLOCK_M + i, M - 1)
                x_row = x_ptr + row.to(tl.int64) * x_row_stride + k0 + offs_x
                xi = tl.load(x_row).to(tl.float32)  # [BLOCK_K / 8, 8]
                part = tl.sum(tl.sum(w3 * xi[:, :, None], axis=1), axis=0) * s  # [BLOCK_N]
                acc += tl.where(rows[:, None] == i, part[None, :], 0.0)
    mask = mask_m[:, None] & mask_n[None, :]
    if PARTIAL:
        part_ptrs = out_ptr + tl.program_id(2).to(tl.int64) * share_stride
        tl.store(part_ptrs + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], acc, mask=mask)
    else:
        out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * out_row_stride + offs_n[None, :]
        if ACCUMULATE:
            acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _nibble_term(word, AT: tl.constexpr, zf, x_ptrs):
    """(q - zero) * x for the nibble at bits 4 AT to 4 AT + 3 of each word (in_place_nibbles)."""
    bits = (word & (0xF << (4 * AT))) | ((150 - 4 * AT) << 23)
    w = bits.to(tl.float32, bitcast=True) - (zf + 2.0 ** (23 - 4 * AT))[None, :]
    return w * tl.load(x_ptrs).to(tl.float32)[:, None]


@triton.jit
def in_place_nibbles(packed, zf, x_row):
    """sum over the step's K of (q - zero) * x for one row of x: packed [BLOCK_K / 8, BLOCK_N]
    words, zf [BLOCK_N] zero points as float32, x_row [BLOCK_K / 8] pointers to x[8i] -> [BLOCK_N].
    Nibble j of a word (j < 5) masked where it lies, bits 4j to 4j + 3, is the mantissa of a float32
    whose exponent makes bit 4j worth 1: OR-ed with (150 - 4j) << 23 it reads 2^(23 - 4j) + q, and
    less 2^(23 - 4j) + zero it is q - zero, exact; nibbles 5 to 7 the same after one shift of the
    word by 20. So a weight costs a mask (with its OR), a subtraction and an FMA, and x is used as
    it is (on an H100 at M = 1, 5-12 % faster than the shifted nibbles of the rows path)."""
    t = tl.zeros(packed.shape, dtype=tl.float32)
    for j in tl.static_range(5):
        t += _nibble_term(packed, j, zf, x_row + j)
    hi = packed >> 20
    for j in tl.static_range(3):
        t += _nibble_term(hi, j, zf, x_row + 5 + j)
    return tl.sum(t, axis=0)


_int4_matmul_launch = launcher(_int4_matmul_kernel)


def _check(x: torch.Tensor, w: Int4Weight, out: torch.Tensor | None) -> None:
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or x.dtype not in DTYPES:
        raise ValueError(
            f"int4_matmul: x must be [M, {k}] of {DTYPES} with a contiguous last dim, got {tuple(x.shape)} {x.dtype}"
        )
    for name, t in (("qweight", w.qweight), ("zeros", w.zeros), ("scales", w.scales)):
        if not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"int4_matmul: {name} must be contiguous on {x.device}")
    m = x.shape[0]
    if out is not None and (out.shape != (m, n) or out.stride(-1) != 1 or out.dtype != x.dtype):
        raise ValueError(f"int4_matmul: out must be [{m}, {n}] {x.dtype} with a contiguous last dim")


def choose_tile(m: int, w: Int4Weight, tile: Tile | None) -> Tile:
    """The launch of an [m, K] product with w: tile (whose BLOCK_K must divide the group size, so a
    step reads one row of scales), else INT4_TILES' entry where its BLOCK_K divides the group,
    else INT4_DEFAULT with BLOCK_K at most the group (the group sizes read, 32 to 256, are powers
    of two: it divides them)."""
    g = w.group_size
    if tile is not None:
        if g % tile.block_k:
            raise ValueError(f"int4_matmul: BLOCK_K {tile.block_k} must divide the group size {g}")
        return tile
    n, k = w.shape
    found = lookup(INT4_TILES, INT4_DEFAULT, m, n, k)
    if g % found.block_k == 0:
        return found
    return replace(INT4_DEFAULT, block_k=min(INT4_DEFAULT.block_k, g))


def pairs_mode(x: torch.Tensor, t: Tile) -> int:
    """How a product takes one row of x: in packed pairs (int4_pairs.py) where x is one 16-bit row
    on 4-byte words and the tile is an FMA tile: in PTX for bfloat16 x on a GPU of compute
    capability 8.0 or more (1); emulated in the interpreter, which has float16 but no bfloat16
    (2: the pairs' indexing and sums, shared with the PTX, tested on the CPU); else the float32
    path (0). Not float16 on a GPU: float16 products of q - zero (up to 15) with x overflow where
    |x| passes about a thousand, which bfloat16's range never does. PAIRS False: never."""
    if not PAIRS or x.shape[0] != 1 or t.dot or x.dtype not in (torch.float16, torch.bfloat16) or x.data_ptr() % 4:
        return 0
    if not x.is_cuda:
        return 2
    return 1 if x.dtype == torch.bfloat16 and _capability(x.device.index) >= (8, 0) else 0


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def int4_matmul(
    x: torch.Tensor,
    w: Int4Weight,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    tile: Tile | None = None,
) -> torch.Tensor:
    """x [M, K] (float32, float16 or bfloat16, last dim contiguous) @ W.t() -> [M, N] in x's dtype
    (into out when given; accumulate: added to out). tile: the launch (None: choose_tile's); a
    dot=False tile for M > FMA_MAX_M is refused (ValueError)."""
    _check(x, w, out)
    (m, k), n = x.shape, w.shape[0]
    if out is None:
        assert not accumulate, "accumulate needs out"
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    t = choose_tile(m, w, tile)
    check_rows("int4_matmul", t, m)
    plan = plan_split(m, n, k // t.block_k, t.block_n, t.block_k, n * k // 2, x.device, t.split, t.dot)
    _int4_matmul_launch[plan.grid](
        x,
        w.qweight,
        w.zeros,
        w.scales,
        out if plan.partials is None else plan.partials,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        m * n,
        plan.share_k,
        GROUP=w.group_size,
        BLOCK_M=plan.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        PARTIAL=plan.partials is not None,
        ACCUMULATE=accumulate,
        IEEE=x.dtype == torch.float32,
        DOT=t.dot,
        PAIRS=pairs_mode(x, t),
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )
    return out if plan.partials is None else split_k_sum(plan.partials, out, accumulate)
