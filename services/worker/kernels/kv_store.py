"""Write this step's K and V into the token KV pool: pool[slots[t]] = kv[t].

One program per token copies all KV heads of K and V; k and v may be strided views into
the packed qkv projection (last dim contiguous), so no copy is made before the store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import launcher, next_pow2
from services.worker.kernels.strides import KVStrides, PoolStrides


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    kp_ptr,
    vp_ptr,
    slots_ptr,
    k_row_stride,
    k_head_stride,
    v_row_stride,
    v_head_stride,
    kp_slot_stride,
    kp_head_stride,
    vp_slot_stride,
    vp_head_stride,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < num_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]  # [BLOCK_H, BLOCK_D]
    k = tl.load(k_ptr + token * k_row_stride + offs_h[:, None] * k_head_stride + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * v_row_stride + offs_h[:, None] * v_head_stride + offs_d[None, :], mask=mask)
    kp = kp_ptr + slot * kp_slot_stride + offs_h[:, None] * kp_head_stride + offs_d[None, :]
    vp = vp_ptr + slot * vp_slot_stride + offs_h[:, None] * vp_head_stride + offs_d[None, :]
    tl.store(kp, k.to(kp_ptr.dtype.element_ty), mask=mask)
    tl.store(vp, v.to(vp_ptr.dtype.element_ty), mask=mask)


_store_kv_launch = launcher(_store_kv_kernel)


def check_kv_store_args(
    name: str, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor
) -> None:
    """Shared input checks of the KV store kernels (plain and int8)."""
    if k.dim() != 3 or v.shape != k.shape or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(f"{name}: k and v must be [T, Hkv, D] with a contiguous last dim, got {tuple(k.shape)}")
    if k_pool.dim() != 3 or v_pool.shape != k_pool.shape or k_pool.shape[1:] != k.shape[1:]:
        raise ValueError(f"{name}: pools must be [slots, {k.shape[1]}, {k.shape[2]}], got {tuple(k_pool.shape)}")
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError(f"{name}: pools need a contiguous last dim")
    if slots.shape != (k.shape[0],) or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: slots must be [{k.shape[0]}] int32/int64, got {tuple(slots.shape)} {slots.dtype}")


def store_kv(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor) -> None:
    """k, v: [T, Hkv, D]; k_pool, v_pool: [slots, Hkv, D]; slots: [T] -> pool[slots[t]] = kv[t]."""
    check_kv_store_args("store_kv", k, v, k_pool, v_pool, slots)
    t, h, d = k.shape
    if t == 0:
        return
    _store_kv_launch[(t,)](
        k_ptr=k,
        v_ptr=v,
        kp_ptr=k_pool,
        vp_ptr=v_pool,
        slots_ptr=slots,
        **KVStrides.of(k, v)._asdict(),
        **PoolStrides.of(k_pool, v_pool)._asdict(),
        num_heads=h,
        HEAD_DIM=d,
        BLOCK_H=next_pow2(h),
        BLOCK_D=next_pow2(d),
        num_warps=4,
    )
