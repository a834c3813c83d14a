"""Per-head RMSNorm of q and k in place, one launch for both: Qwen3's and Gemma 3's head norms
after the QKV projection and before rotary.

q [T, Hq, D] and k [T, Hk, D] are views of the projection's output (rows of any stride, heads
contiguous). One program per (token, head) normalises the head's D values over D with the
weight of its kind (q_weight for the first Hq heads, k_weight for the rest) and writes them
back where they were. The arithmetic is ``TorchOps.rmsnorm``'s (rmsnorm.weighted): float32
statistics; the row rounded to the dtype before Llama's weight multiply, or times 1 + weight
in float32 with UNIT_OFFSET (Gemma's). In place of a reshape, a norm and a copy back for each
of q and k: six launches a layer become one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import launcher, next_pow2
from services.worker.kernels.rmsnorm import weighted


@triton.jit
def _head_rmsnorm_kernel(
    q_ptr,
    k_ptr,
    qw_ptr,
    kw_ptr,
    q_row_stride,
    k_row_stride,
    q_heads,
    head_dim,
    eps,
    BLOCK: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK)
    mask = offs < head_dim
    if head < q_heads:
        ptr = q_ptr + row * q_row_stride + head * head_dim
        w_ptr = qw_ptr
    else:
        ptr = k_ptr + row * k_row_stride + (head - q_heads) * head_dim
        w_ptr = kw_ptr
    x = tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / head_dim + eps)
    y = weighted(x, rstd, w_ptr, offs, mask, q_ptr.dtype.element_ty, UNIT_OFFSET)
    tl.store(ptr + offs, y.to(q_ptr.dtype.element_ty), mask=mask)


_head_rmsnorm_launch = launcher(_head_rmsnorm_kernel)


def _check(name: str, t: torch.Tensor, rows: int, head_dim: int, dtype: torch.dtype) -> None:
    if t.dim() != 3 or t.shape[0] != rows or t.shape[2] != head_dim or t.dtype != dtype:
        raise ValueError(
            f"head_rmsnorm_: {name} must be [{rows}, heads, {head_dim}] {dtype}, got {tuple(t.shape)} {t.dtype}"
        )
    if t.stride(2) != 1 or t.stride(1) != head_dim:
        raise ValueError(f"head_rmsnorm_: {name}'s heads must be contiguous in a row, got strides {t.stride()}")


def head_rmsnorm_(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    unit_offset: bool = False,
) -> None:
    """q [T, Hq, D], k [T, Hk, D] of one dtype, each head normed over D in place; q_weight and
    k_weight: [D]. unit_offset: Gemma's norm, times 1 + weight."""
    t, _, d = q.shape if q.dim() == 3 else (0, 0, 0)
    _check("q", q, t, d, q.dtype)
    _check("k", k, t, d, q.dtype)
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if w.shape != (d,) or not w.is_contiguous():
            raise ValueError(f"head_rmsnorm_: {name} must be contiguous [{d}], got {tuple(w.shape)}")
    heads = q.shape[1] + k.shape[1]
    if t == 0 or heads == 0:
        return
    _head_rmsnorm_launch[(t, heads)](
        q, k, q_weight, k_weight, q.stride(0), k.stride(0), q.shape[1], d, eps,
        BLOCK=next_pow2(d), UNIT_OFFSET=unit_offset, num_warps=1 if d <= 256 else 4,
    )  # fmt: skip
