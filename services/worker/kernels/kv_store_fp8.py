"""One token's K or V, all its heads, quantized to FP8 e4m3 and written into the token KV pool
(kv_store_quant.py's kernel calls it for K and for V).

Each token's K and V are stored per head as e4m3 with a power-of-two scale 2^e kept as its int8
exponent e, the smallest power of two not under absmax / 448, matching ``kv_cache.quantize_fp8``:
the division is IEEE-rounded (div_rn) and e is read from the quotient's bits, the values are
multiplied by 2^-e (exact), and each is rounded to its nearest e4m3 neighbour here, ties to even,
before the conversion (which then only changes the format of a value e4m3 holds exactly), so the
stored bytes equal the reference's on any conversion instruction, Triton's interpreter's too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn


@triton.jit
def round_to_e4m3(y):
    """float32 y with |y| <= 448 -> the nearest e4m3 value, ties to even, still float32."""
    bits = y.to(tl.int32, bitcast=True)
    a = tl.abs(y)
    exponent = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF
    # e4m3 has 3 mantissa bits: a step of 2^(e - 3) in binade e, 2^-9 below its smallest normal 2^-6
    step = ((tl.maximum(exponent, 127 - 6) - 3) << 23).to(tl.float32, bitcast=True)
    steps = a / step  # exact: a power-of-two divisor, < 16
    low = tl.floor(steps)
    frac = steps - low
    low_is_odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    r = tl.where((frac > 0.5) | ((frac == 0.5) & low_is_odd), low + 1.0, low) * step
    return tl.where(bits < 0, -r, r)  # the sign bit: -0.0 stays -0.0, as torch converts it


@triton.jit
def quantize_store_fp8(
    x_ptr,
    row_stride,
    head_stride,
    pool_ptr,
    pool_slot_stride,
    pool_head_stride,
    scale_ptr,
    scale_slot_stride,
    scale_head_stride,
    token,
    slot,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    hmask = offs_h < num_heads
    mask = hmask[:, None] & (offs_d < HEAD_DIM)[None, :]  # [BLOCK_H, BLOCK_D]
    x = tl.load(x_ptr + token * row_stride + offs_h[:, None] * head_stride + offs_d[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    absmax = tl.max(tl.abs(x), axis=1)  # [BLOCK_H]
    bits = tl.math.div_rn(tl.maximum(absmax, 1e-8), 448.0).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # 2^e >= absmax / 448
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e
    y = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
    q = round_to_e4m3(y).to(pool_ptr.dtype.element_ty)
    tl.store(pool_ptr + slot * pool_slot_stride + offs_h[:, None] * pool_head_stride + offs_d[None, :], q, mask=mask)
    tl.store(scale_ptr + slot * scale_slot_stride + offs_h * scale_head_stride, e.to(tl.int8), mask=hmask)
