"""Quantize this step's K and V and write them into an int8 or FP8 e4m3 token KV pool, with their
per-token, per-head scales: one program per token, K then V, each read once, its rows' absmax
taken, its codes and scales made the format's way (kv_store_int8.py: float32 scales;
kv_store_fp8.py: int8 exponents of power-of-two scales) and stored. k and v may be strided views
into the packed qkv projection."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.kv_store import check_kv_store_args
from services.worker.kernels.kv_store_fp8 import FP8, fp8_codes
from services.worker.kernels.kv_store_int8 import int8_codes
from services.worker.kernels.launch import launcher, next_pow2
from services.worker.kernels.strides import KVStrides, PoolStrides, ScaleStrides

SCALE_DTYPES = {torch.int8: torch.float32, FP8: torch.int8}  # a pool's dtype -> its scales'


@triton.jit
def _quantize_store(
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
    if pool_ptr.dtype.element_ty == tl.int8:
        q, s = int8_codes(x, absmax)
    else:
        q, s = fp8_codes(x, absmax)
    q_ptrs = pool_ptr + slot * pool_slot_stride + offs_h[:, None] * pool_head_stride + offs_d[None, :]
    tl.store(q_ptrs, q.to(pool_ptr.dtype.element_ty), mask=mask)
    tl.store(
        scale_ptr + slot * scale_slot_stride + offs_h * scale_head_stride, s.to(scale_ptr.dtype.element_ty), mask=hmask
    )


@triton.jit
def _store_kv_quant_kernel(
    k_ptr,
    v_ptr,
    kp_ptr,
    vp_ptr,
    ks_ptr,
    vs_ptr,
    slots_ptr,
    k_row_stride,
    k_head_stride,
    v_row_stride,
    v_head_stride,
    kp_slot_stride,
    kp_head_stride,
    vp_slot_stride,
    vp_head_stride,
    ks_slot_stride,
    ks_head_stride,
    vs_slot_stride,
    vs_head_stride,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    _quantize_store(
        k_ptr, k_row_stride, k_head_stride, kp_ptr, kp_slot_stride, kp_head_stride, ks_ptr,
        ks_slot_stride, ks_head_stride, token, slot, num_heads, HEAD_DIM, BLOCK_H, BLOCK_D,
    )  # fmt: skip
    _quantize_store(
        v_ptr, v_row_stride, v_head_stride, vp_ptr, vp_slot_stride, vp_head_stride, vs_ptr,
        vs_slot_stride, vs_head_stride, token, slot, num_heads, HEAD_DIM, BLOCK_H, BLOCK_D,
    )  # fmt: skip


_store_kv_quant_launch = launcher(_store_kv_quant_kernel)


def store_kv_quantized(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """k, v: [T, Hkv, D]; pools: [C, Hkv, D] int8 or float8_e4m3fn; scales: [C, Hkv], float32 for
    an int8 pool, int8 exponents for an e4m3 one; slots: [T]."""
    check_kv_store_args("store_kv_quantized", k, v, k_pool, v_pool, slots)
    if k_pool.dtype not in SCALE_DTYPES or v_pool.dtype != k_pool.dtype:
        raise ValueError(f"store_kv_quantized: pools must be int8 or float8_e4m3fn, got {k_pool.dtype} {v_pool.dtype}")
    scale_dtype = SCALE_DTYPES[k_pool.dtype]
    for s in (k_scale, v_scale):
        if s.shape != k_pool.shape[:2] or s.dtype != scale_dtype:
            raise ValueError(
                f"store_kv_quantized: scales of a {k_pool.dtype} pool must be {tuple(k_pool.shape[:2])} "
                f"{scale_dtype}, got {tuple(s.shape)} {s.dtype}"
            )
    t, h, d = k.shape
    if t == 0:
        return
    _store_kv_quant_launch[(t,)](
        k_ptr=k,
        v_ptr=v,
        kp_ptr=k_pool,
        vp_ptr=v_pool,
        ks_ptr=k_scale,
        vs_ptr=v_scale,
        slots_ptr=slots,
        **KVStrides.of(k, v)._asdict(),
        **PoolStrides.of(k_pool, v_pool)._asdict(),
        **ScaleStrides.of(k_scale, v_scale)._asdict(),
        num_heads=h,
        HEAD_DIM=d,
        BLOCK_H=next_pow2(h),
        BLOCK_D=next_pow2(d),
        num_warps=4,
    )
