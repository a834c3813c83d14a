"""One token's K or V, all its heads, quantized to int8 and written into the token KV pool
(kv_store_quant.py's kernel calls it for K and for V).

Each token's K and V are stored per head as int8 with a float32 scale absmax / 127,
matching ``kv_cache.quantize_int8``: the divisions are IEEE-rounded (div_rn) and the
rounding is half-to-even like torch.round, so the stored values are bit-identical to
the reference.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def quantize_store_int8(
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
    scale = tl.math.div_rn(tl.maximum(absmax, 1e-8), 127.0)
    y = tl.math.div_rn(x, scale[:, None])
    # round half to even, exactly: |y| <= 127, so y - floor(y) is exact in float32
    low = tl.floor(y)
    frac = y - low
    low_is_odd = (low - 2.0 * tl.floor(low * 0.5)) != 0.0
    rounded = tl.where((frac > 0.5) | ((frac == 0.5) & low_is_odd), low + 1.0, low)
    q = tl.minimum(tl.maximum(rounded, -127.0), 127.0).to(tl.int8)
    tl.store(pool_ptr + slot * pool_slot_stride + offs_h[:, None] * pool_head_stride + offs_d[None, :], q, mask=mask)
    tl.store(scale_ptr + slot * scale_slot_stride + offs_h * scale_head_stride, scale, mask=hmask)
