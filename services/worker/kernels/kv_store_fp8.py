"""Quantize this step's K and V to FP8 e4m3 and write them into the token KV pool.

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

from services.worker.kernels.kv_store import check_kv_store_args
from services.worker.kernels.launch import launcher, next_pow2
from services.worker.kernels.strides import KVStrides, PoolStrides, ScaleStrides

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
    bits = tl.math.div_rn(tl.maximum(absmax, 1e-8), 448.0).to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # 2^e >= absmax / 448
    inv = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e
    y = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
    q = round_to_e4m3(y).to(pool_ptr.dtype.element_ty)
    tl.store(pool_ptr + slot * pool_slot_stride + offs_h[:, None] * pool_head_stride + offs_d[None, :], q, mask=mask)
    tl.store(scale_ptr + slot * scale_slot_stride + offs_h * scale_head_stride, e.to(tl.int8), mask=hmask)


@triton.jit
def _store_kv_fp8_kernel(
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
        k_ptr,
        k_row_stride,
        k_head_stride,
        kp_ptr,
        kp_slot_stride,
        kp_head_stride,
        ks_ptr,
        ks_slot_stride,
        ks_head_stride,
        token,
        slot,
        num_heads,
        HEAD_DIM,
        BLOCK_H,
        BLOCK_D,
    )
    _quantize_store(
        v_ptr,
        v_row_stride,
        v_head_stride,
        vp_ptr,
        vp_slot_stride,
        vp_head_stride,
        vs_ptr,
        vs_slot_stride,
        vs_head_stride,
        token,
        slot,
        num_heads,
        HEAD_DIM,
        BLOCK_H,
        BLOCK_D,
    )


_store_kv_fp8_launch = launcher(_store_kv_fp8_kernel)


def store_kv_fp8(
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """k, v: [T, Hkv, D]; pools: [C, Hkv, D] float8_e4m3fn; scales: [C, Hkv] int8 exponents; slots: [T]."""
    check_kv_store_args("store_kv_fp8", k, v, k_pool, v_pool, slots)
    if k_pool.dtype != FP8 or v_pool.dtype != FP8:
        raise ValueError(f"store_kv_fp8: pools must be float8_e4m3fn, got {k_pool.dtype} {v_pool.dtype}")
    for s in (k_scale, v_scale):
        if s.shape != k_pool.shape[:2] or s.dtype != torch.int8:
            raise ValueError(
                f"store_kv_fp8: scales must be {tuple(k_pool.shape[:2])} int8 exponents, got {tuple(s.shape)} {s.dtype}"
            )
    t, h, d = k.shape
    if t == 0:
        return
    _store_kv_fp8_launch[(t,)](
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
