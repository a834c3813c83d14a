"""The FP8 e4m3 codes and scales of one token's K or V, all its heads (kv_store_quant.py's
kernel stores them).

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
    # the sign bit put back by its bits: a negative value that rounds to 0 is -0.0, as torch converts it
    # (tl.where(bits < 0, -r, r) gave +0.0 there once compiled for a GPU, -0.0 in the interpreter)
    sign = (bits >> 31) << 31
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def fp8_codes(x, absmax):
    """x [BLOCK_H, BLOCK_D] float32 and its rows' absmax -> (the e4m3 values, still float32, and
    each row's scale exponent e as int32: the scale is 2^e)."""
    bits = tl.math.div_rn(tl.maximum(absmax, 1e-8), 448.0).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # 2^e >= absmax / 448
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e
    y = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
    return round_to_e4m3(y), e
