"""Strides the kernels take, in small named structures: a wrapper builds them from its tensors
and passes them by keyword (``**PoolStrides.of(k_pool, v_pool)._asdict()``), so that a launch
reads as names, and the field names are the kernels' parameter names."""

from __future__ import annotations

from typing import NamedTuple

import torch


class PoolStrides(NamedTuple):
    """Slot and head strides of the K and V pools [C, Hkv, D]."""

    kp_slot_stride: int
    kp_head_stride: int
    vp_slot_stride: int
    vp_head_stride: int

    @classmethod
    def of(cls, k_pool: torch.Tensor, v_pool: torch.Tensor) -> PoolStrides:
        return cls(k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1))


class ScaleStrides(NamedTuple):
    """Slot and head strides of an int8 pool's K and V scales [C, Hkv] (or of the 2-d stand-in
    a kernel gets for a float pool and does not read)."""

    ks_slot_stride: int
    ks_head_stride: int
    vs_slot_stride: int
    vs_head_stride: int

    @classmethod
    def of(cls, k_scale: torch.Tensor, v_scale: torch.Tensor) -> ScaleStrides:
        return cls(k_scale.stride(0), k_scale.stride(1), v_scale.stride(0), v_scale.stride(1))


class KVStrides(NamedTuple):
    """Token and head strides of new tokens' K and V [T, Hkv, D], on their way to the pool."""

    k_row_stride: int
    k_head_stride: int
    v_row_stride: int
    v_head_stride: int

    @classmethod
    def of(cls, k: torch.Tensor, v: torch.Tensor) -> KVStrides:
        return cls(k.stride(0), k.stride(1), v.stride(0), v.stride(1))
