"""Weight-only int4 matmul: x [M, K] @ W.t() with W an Int4Weight (models/int4_weight.py),
dequantized in registers, tile by tile, and never written out.

Each program computes a [BLOCK_M, BLOCK_N] tile of the output over K in BLOCK_K steps; BLOCK_K
divides the group size, so a step reads one row of scales and zero points. The packed words
are read once per row of eight inputs (the eight rows of a word share an address, served
from cache), shifted and masked to 4-bit values, and (q - zero) * scale is computed in float32
and rounded to x's dtype, as the reference (``int4_reference``) dequantizes before its matmul;
products accumulate in float32 (IEEE for float32 inputs, not TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher
from services.worker.models.int4_weight import Int4Weight

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _int4_matmul_kernel(
    x_ptr,
    qw_ptr,
    z_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    x_row_stride,
    out_row_stride,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    IEEE: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    dtype = x_ptr.dtype.element_ty
    shifts = ((offs_k % 8) * 4)[:, None]  # [BLOCK_K, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * x_row_stride + k[None, :], mask=mask_m[:, None], other=0.0)
        packed = tl.load(qw_ptr + (k // 8)[:, None].to(tl.int64) * N + offs_n[None, :], mask=mask_n[None, :], other=0)
        q = (packed >> shifts) & 0xF  # [BLOCK_K, BLOCK_N]
        g = k0 // GROUP
        z = tl.load(z_ptr + g * N + offs_n, mask=mask_n, other=0).to(tl.int32)
        s = tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        w = ((q - z[None, :]).to(tl.float32) * s[None, :]).to(dtype)
        if IEEE:
            acc += tl.dot(a, w, input_precision="ieee")
        else:
            acc += tl.dot(a, w)
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * out_row_stride + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if ACCUMULATE:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_int4_matmul_launch = launcher(_int4_matmul_kernel)


def int4_matmul(
    x: torch.Tensor, w: Int4Weight, out: torch.Tensor | None = None, accumulate: bool = False
) -> torch.Tensor:
    """x [M, K] (float32, float16 or bfloat16, last dim contiguous) @ W.t() -> [M, N] in x's dtype
    (into out when given; accumulate: added to out)."""
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or x.dtype not in DTYPES:
        raise ValueError(
            f"int4_matmul: x must be [M, {k}] of {DTYPES} with a contiguous last dim, got {tuple(x.shape)} {x.dtype}"
        )
    for name, t in (("qweight", w.qweight), ("zeros", w.zeros), ("scales", w.scales)):
        if not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"int4_matmul: {name} must be contiguous on {x.device}")
    m = x.shape[0]
    if out is None:
        assert not accumulate, "accumulate needs out"
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.stride(-1) != 1 or out.dtype != x.dtype:
        raise ValueError(f"int4_matmul: out must be [{m}, {n}] {x.dtype} with a contiguous last dim")
    if m == 0:
        return out
    block_m = 16 if m <= 16 else 64
    block_n = 64
    block_k = min(64, w.group_size)
    grid = (cdiv(m, block_m), cdiv(n, block_n))
    _int4_matmul_launch[grid](
        x,
        w.qweight,
        w.zeros,
        w.scales,
        out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        GROUP=w.group_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        ACCUMULATE=accumulate,
        IEEE=x.dtype == torch.float32,
        num_warps=4,
    )
    return out
