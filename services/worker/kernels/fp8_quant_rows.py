"""Quantize each row of activations to FP8 e4m3 with its own float32 scale, in one kernel: the
FP8 product's per-token input (models/layers/fp8_product.py), which PyTorch would spend five
kernels on (abs, amax, divide, clamp, convert), each a launch in every projection of a step.

One program per row. A row of up to ONE_PASS_MAX values is read once and held in registers: its
absmax, then round-to-nearest-even e4m3 values of x / scale with scale = max(absmax / 448,
MIN_SCALE), as
``fp8_product.quantize_tokens`` does: the same IEEE division (div_rn), each value rounded to its
nearest e4m3 value before the conversion (kv_store_fp8's rounding), so the bytes are the
reference's, under the interpreter too. A longer row takes two passes over memory (the absmax,
then the values). At a decode batch of 64 on an H100 the two-pass form, 4 warps and tiles of
2048, took 6.8 µs a launch, 0.88 ms of the FP8 step's 7.63 (129 launches): latency, 64 programs
each walking its row twice.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from services.worker.kernels.kv_store_fp8 import round_to_e4m3
from services.worker.kernels.launch import launcher
from services.worker.models.fp8_weight import FP8, FP8_MAX, MIN_SCALE

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
E4M3_MAX: tl.constexpr = tl.constexpr(FP8_MAX)  # quantize_row's, as the kernel's own arguments pass them
E4M3_MIN_SCALE: tl.constexpr = tl.constexpr(MIN_SCALE)


@triton.jit
def _fp8_quant_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    K,
    x_row_stride,
    q_row_stride,
    FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ONE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    if ONE_PASS:  # the whole row in one tile, read once
        x = tl.load(x_ptr + row * x_row_stride + offs, mask=offs < K, other=0.0).to(tl.float32)
        quantize_row(q_ptr + row * q_row_stride + offs, s_ptr + row, x, offs < K)
    else:
        absmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs
            x = tl.load(x_ptr + row * x_row_stride + k, mask=k < K, other=0.0).to(tl.float32)
            absmax = tl.maximum(absmax, tl.abs(x))
        scale = _scale(absmax, FP8_MAX, MIN_SCALE)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + offs
            x = tl.load(x_ptr + row * x_row_stride + k, mask=k < K, other=0.0).to(tl.float32)
            _store_e4m3(q_ptr + row * q_row_stride + k, x, scale, k < K, FP8_MAX)
        tl.store(s_ptr + row, scale)


@triton.jit
def quantize_row(q_ptrs, s_ptr, x, mask):
    """A whole row x (float32, zero past mask) -> its e4m3 values at q_ptrs and its scale at
    s_ptr: the bytes fp8_quant_rows stores, for a kernel that already holds the row (a norm's
    output, silu_mul's) and so saves the product its own launch."""
    scale = _scale(tl.abs(x), E4M3_MAX, E4M3_MIN_SCALE)
    _store_e4m3(q_ptrs, x, scale, mask, E4M3_MAX)
    tl.store(s_ptr, scale)


@triton.jit
def _scale(absmax, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr):
    """A row's scale from its values' magnitudes (a tile of them): max / 448, at least MIN_SCALE."""
    return tl.maximum(tl.math.div_rn(tl.max(absmax, axis=0), FP8_MAX), MIN_SCALE)


@triton.jit
def _store_e4m3(q_ptrs, x, scale, mask, FP8_MAX: tl.constexpr):
    """x / scale, clamped to e4m3's range and rounded to its nearest e4m3 value, stored."""
    y = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
    tl.store(q_ptrs, round_to_e4m3(y).to(q_ptrs.dtype.element_ty), mask=mask)


_fp8_quant_rows_launch = launcher(_fp8_quant_rows_kernel)

ROWS_ATTR = "fp8_rows"  # the attribute of a tensor that carries its Fp8Rows
ONE_PASS_MAX = 16384  # the longest row held in registers: 32 float32 values a thread at 16 warps
TWO_PASS_BLOCK = 4096


def launch_shape(k: int) -> tuple[int, bool, int]:
    """(BLOCK_K, whether one pass, warps) for rows of k values: a warp for every 512 values of
    the tile, 4 to 16."""
    one_pass = k <= ONE_PASS_MAX
    block = triton.next_power_of_2(k) if one_pass else TWO_PASS_BLOCK
    return block, one_pass, min(16, max(4, block // 512))


class Fp8Rows(NamedTuple):
    """Activations quantized per token: e4m3 [T, K] contiguous and float32 scales [T, 1]."""

    q: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def empty(t: int, k: int, device: torch.device) -> Fp8Rows:
        return Fp8Rows(
            torch.empty((t, k), dtype=FP8, device=device), torch.empty((t, 1), dtype=torch.float32, device=device)
        )

    def check(self, where: str, t: int, k: int) -> None:
        """Refuse rows that are not [t, k] e4m3 contiguous with [t, 1] float32 scales."""
        q, s = self
        if (
            q.shape != (t, k)
            or q.dtype != FP8
            or not q.is_contiguous()
            or s.shape != (t, 1)
            or s.dtype != torch.float32
        ):
            raise ValueError(f"{where}: fp8 rows must be e4m3 [{t}, {k}] contiguous and float32 scales [{t}, 1]")


def attached_rows(x: torch.Tensor) -> Fp8Rows | None:
    """The e4m3 rows the kernel that wrote x stored beside it (ops.fp8_rows), if any: the same
    bytes fp8_quant_rows(x) would give. They hold while x is only read: an in-place write to x
    would leave them stale (nothing writes a norm's or silu_mul's output before its product
    reads it; a gather, view or slice of x is a new tensor, without them)."""
    rows = getattr(x, ROWS_ATTR, None)
    return rows if rows is not None and rows.q.shape == x.shape else None


def row_pointers(rows: Fp8Rows | None, stand_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A kernel's (q, scale) arguments: rows', else stand_in twice (a QUANT=False launch reads neither)."""
    return (rows.q, rows.scale) if rows is not None else (stand_in, stand_in)


def with_rows(x: torch.Tensor, rows: Fp8Rows | None) -> torch.Tensor:
    """x, carrying rows (its e4m3 rows, written by the kernel that wrote x) when they are given."""
    if rows is not None:
        setattr(x, ROWS_ATTR, rows)
    return x


def fp8_quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] (float32, float16 or bfloat16, last dim contiguous) -> (e4m3 [T, K] contiguous,
    float32 scales [T, 1])."""
    if x.dim() != 2 or x.stride(-1) != 1 or x.dtype not in DTYPES:
        raise ValueError(
            f"fp8_quant_rows: x must be [T, K] of {DTYPES} with a contiguous last dim, got {tuple(x.shape)} {x.dtype}"
        )
    t, k = x.shape
    q = torch.empty((t, k), dtype=FP8, device=x.device)
    s = torch.empty((t, 1), dtype=torch.float32, device=x.device)
    if t == 0:
        return q, s
    block, one_pass, warps = launch_shape(k)
    _fp8_quant_rows_launch[(t,)](
        x,
        q,
        s,
        k,
        x.stride(0),
        q.stride(0),
        FP8_MAX=FP8_MAX,
        MIN_SCALE=MIN_SCALE,
        BLOCK_K=block,
        ONE_PASS=one_pass,
        num_warps=warps,
    )
    return q, s
