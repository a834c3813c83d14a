"""The int8 codes and scales of one token's K or V, all its heads (kv_store_quant.py's kernel
stores them).

Each token's K and V are stored per head as int8 with a float32 scale absmax / 127,
matching ``kv_cache.quantize_int8``: the divisions are IEEE-rounded (div_rn) and the
rounding is half-to-even like torch.round, so the stored values are bit-identical to
the reference.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def int8_codes(x, absmax):
    """x [BLOCK_H, BLOCK_D] float32 and its rows' absmax -> (the int8 codes, as float32 integers in
    [-127, 127], and each row's float32 scale)."""
    scale = tl.math.div_rn(tl.maximum(absmax, 1e-8), 127.0)
    y = tl.math.div_rn(x, scale[:, None])
    # round half to even, exactly: |y| <= 127, so y - floor(y) is exact in float32
    low = tl.floor(y)
    frac = y - low
    low_is_odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    rounded = tl.where((frac > 0.5) | ((frac == 0.5) & low_is_odd), low + 1.0, low)
    return tl.minimum(tl.maximum(rounded, -127.0), 127.0), scale
