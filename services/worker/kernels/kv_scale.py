"""A quantized KV pool's per-token, per-head scales as the attention kernels read them."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_kv_scale(s_ptr, slots, slot_stride, kvh, head_stride, nmask):
    """The scales of the given slots for KV head kvh, float32 [BLOCK_N]: stored as float32 (int8 K
    and V), or as the int8 exponent e of 2^e (e4m3 K and V, memory/kv_cache.py), built here from
    its bits: no conversion instruction, and exact. An exponent is read in the 4-byte word that
    holds it (the scales start on a word, check_pool): a byte load cannot be an asynchronous copy,
    so the loop's software pipeline would wait on it each tile (on an H100 an e4m3 pool's decode
    attention took 96.8 us a layer at batch 64, context 1024, with byte loads, 79.8 with float32
    scales)."""
    if s_ptr.dtype.element_ty == tl.int8:
        at = slots * slot_stride + kvh * head_stride  # bytes
        word = tl.load(s_ptr.to(tl.pointer_type(tl.int32)) + (at >> 2), mask=nmask, other=0)
        e = (word << (24 - 8 * (at & 3)).to(tl.int32)) >> 24  # its byte, sign-extended
        s = ((e + 127) << 23).to(tl.float32, bitcast=True)
    else:
        s = tl.load(s_ptr + slots * slot_stride + kvh * head_stride, mask=nmask, other=0)
    return s
