"""A quantized KV pool's per-token, per-head scales as the attention kernels read them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_scale(s_ptr, slots, slot_stride, kvh, head_stride, nmask):
    """The scales of the given slots for KV head kvh, float32 [BLOCK_N]: stored as float32 (int8 K
    and V), or as the int8 exponent e of 2^e (e4m3 K and V, memory/kv_cache.py), built here from
    its bits: no conversion instruction, and exact."""
    s = tl.load(s_ptr + slots * slot_stride + kvh * head_stride, mask=nmask, other=0)
    if s_ptr.dtype.element_ty == tl.int8:
        s = ((s.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return s
