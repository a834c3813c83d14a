"""The arguments the attention kernels' wrappers check alike (extend_attention, decode_attention):
the KV pool and its scales against the queries, and the sliding window and soft cap."""

from __future__ import annotations

import torch

QUANT_POOLS = (torch.int8, torch.float8_e4m3fn)  # pools read with per-token, per-head scales
# the scales each quantized pool may have: int8 K and V float32; e4m3 also the int8 exponent of 2^e
SCALE_KINDS = {torch.int8: (torch.float32,), torch.float8_e4m3fn: (torch.float32, torch.int8)}


def check_pool(
    name: str,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> int:
    """Check the KV pool against q [.., Hq, D]; returns Hkv."""
    hq, d = q.shape[-2:]
    if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{name}: q must be float32/float16/bfloat16, got {q.dtype}")
    if k_pool.dim() != 3 or v_pool.shape != k_pool.shape or k_pool.shape[2] != d:
        raise ValueError(f"{name}: pools must be [slots, Hkv, {d}], got {tuple(k_pool.shape)} {tuple(v_pool.shape)}")
    if k_pool.stride(-1) != 1 or v_pool.stride(-1) != 1:
        raise ValueError(f"{name}: pools need a contiguous last dim")
    hkv = k_pool.shape[1]
    if hq % hkv:
        raise ValueError(f"{name}: {hq} query heads are not a multiple of {hkv} KV heads")
    if (k_scale is None) != (v_scale is None):
        raise ValueError(f"{name}: give both k_scale and v_scale, or neither")
    if k_scale is not None and v_scale is not None:
        if k_pool.dtype not in QUANT_POOLS or v_pool.dtype != k_pool.dtype:
            raise ValueError(f"{name}: scales given but the pools are {k_pool.dtype}, not int8 or float8_e4m3fn")
        kinds = SCALE_KINDS[k_pool.dtype]
        for s in (k_scale, v_scale):
            if s.shape != k_pool.shape[:2] or s.dtype not in kinds:
                want = f"{tuple(k_pool.shape[:2])} of {' or '.join(_name(k) for k in kinds)}"
                raise ValueError(f"{name}: scales must be {want}, got {tuple(s.shape)} of {_name(s.dtype)}")
            if s.dtype == torch.int8 and s.data_ptr() % 4:  # kv_scale.load_kv_scale reads whole words
                raise ValueError(f"{name}: int8 scales must start on a 4-byte boundary")
    elif k_pool.dtype != q.dtype or v_pool.dtype != q.dtype:
        raise ValueError(f"{name}: pools are {k_pool.dtype}/{v_pool.dtype} but q is {q.dtype}")
    return hkv


def check_window_softcap(name: str, window: int, softcap: float) -> None:
    """A window is a whole number of positions, 0 for none; a soft cap positive, 0 for none."""
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"{name}: window must be an int >= 0 (0: none), got {window!r}")
    if softcap < 0:
        raise ValueError(f"{name}: softcap must be >= 0 (0: none), got {softcap!r}")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
