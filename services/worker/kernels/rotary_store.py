"""Rotary embedding fused with the KV store: one kernel where there were two.

For each token, one program rotates its q and k heads in place (as ``rotary_``) and writes
the rotated k, and v, into the pool at the token's slot (as ``store_kv``), so k is not read
back from memory by a second kernel. Steps with prompt tokens use it: q and k stay rotated
in the qkv buffer because extend attention reads this step's new tokens from there. A
decode-only step needs neither kernel: its decode attention rotates and stores the new
tokens itself (decode_attention.NewTokens). Pools of the activation dtype only: an int8 pool
goes through rotary_ and store_kv_quantized, which computes the scales.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.kv_store import check_kv_store_args
from services.worker.kernels.launch import launcher, next_pow2
from services.worker.kernels.rotary import check_rotary_args, rotate_heads
from services.worker.kernels.strides import KVStrides, PoolStrides


@triton.jit
def _rotary_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    kp_ptr,
    vp_ptr,
    pos_ptr,
    slots_ptr,
    cs_ptr,
    q_row_stride,
    q_head_stride,
    k_row_stride,
    k_head_stride,
    v_row_stride,
    v_head_stride,
    kp_slot_stride,
    kp_head_stride,
    vp_slot_stride,
    vp_head_stride,
    cs_row_stride,
    num_q_heads,
    num_kv_heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs_half = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cs_ptr + pos * cs_row_stride + offs_half, mask=offs_half < HALF, other=0.0)  # [BLOCK_HALF] float32
    sin = tl.load(cs_ptr + pos * cs_row_stride + HALF + offs_half, mask=offs_half < HALF, other=0.0)
    rotate_heads(q_ptr, q_row_stride, q_head_stride, token, num_q_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    r1, r2 = rotate_heads(k_ptr, k_row_stride, k_head_stride, token, num_kv_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HK)
    offs_h = tl.arange(0, BLOCK_HK)
    hmask = (offs_h < num_kv_heads)[:, None]
    kp = kp_ptr + slot * kp_slot_stride + offs_h[:, None] * kp_head_stride + offs_half[None, :]
    kmask = hmask & (offs_half < HALF)[None, :]
    tl.store(kp, r1.to(kp_ptr.dtype.element_ty), mask=kmask)
    tl.store(kp + HALF, r2.to(kp_ptr.dtype.element_ty), mask=kmask)
    offs_d = tl.arange(0, BLOCK_D)
    vmask = hmask & (offs_d < 2 * HALF)[None, :]
    v = tl.load(v_ptr + token * v_row_stride + offs_h[:, None] * v_head_stride + offs_d[None, :], mask=vmask)
    vp = vp_ptr + slot * vp_slot_stride + offs_h[:, None] * vp_head_stride + offs_d[None, :]
    tl.store(vp, v.to(vp_ptr.dtype.element_ty), mask=vmask)


_rotary_store_launch = launcher(_rotary_store_kernel)


def rotary_store_(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place (positions [T], cos_sin [max_pos, D]
    float32), then pool[slots[t]] = rotated k[t] and v[t]; pools [slots, Hkv, D] of a float dtype."""
    check_rotary_args("rotary_store", q, k, positions, cos_sin)
    check_kv_store_args("rotary_store", k, v, k_pool, v_pool, slots)
    if not k_pool.is_floating_point() or not v_pool.is_floating_point():
        raise ValueError(
            f"rotary_store: the pools must be of a float dtype, got {k_pool.dtype} (int8: store_kv_quantized)"
        )
    t, hq, d = q.shape
    if t == 0:
        return
    half, hkv = d // 2, k.shape[1]
    _rotary_store_launch[(t,)](
        q_ptr=q,
        k_ptr=k,
        v_ptr=v,
        kp_ptr=k_pool,
        vp_ptr=v_pool,
        pos_ptr=positions,
        slots_ptr=slots,
        cs_ptr=cos_sin,
        q_row_stride=q.stride(0),
        q_head_stride=q.stride(1),
        **KVStrides.of(k, v)._asdict(),
        **PoolStrides.of(k_pool, v_pool)._asdict(),
        cs_row_stride=cos_sin.stride(0),
        num_q_heads=hq,
        num_kv_heads=hkv,
        HALF=half,
        BLOCK_HALF=next_pow2(half),
        BLOCK_HQ=next_pow2(hq),
        BLOCK_HK=next_pow2(hkv),
        BLOCK_D=next_pow2(d),
        num_warps=4,
    )
