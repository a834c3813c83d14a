"""Rotary position embedding (rotate-half / NeoX layout), in place on q and k.

q and k are usually strided views into the packed qkv projection, so the kernel takes
row and head strides and writes back through them: no copy of q or k is made. One program
rotates every q and k head of one token, reading that token's cos/sin row once. The
arithmetic follows ``TorchOps.rotary_``: cos and sin rounded to the activation dtype,
products in float32, result rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import launcher, next_pow2


@triton.jit
def rotate_heads(
    x_ptr,
    row_stride,
    head_stride,
    token,
    num_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Rotate all heads of one token of x in place; cos, sin: [BLOCK_HALF] float32. Returns the
    rotated halves [BLOCK_H, BLOCK_HALF] in x's dtype (for a caller that also stores them)."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h < num_heads)[:, None] & (offs_d < HALF)[None, :]
    ptrs = x_ptr + token * row_stride + offs_h[:, None] * head_stride + offs_d[None, :]  # [BLOCK_H, BLOCK_HALF]
    dtype = x_ptr.dtype.element_ty
    c = cos.to(dtype).to(tl.float32)[None, :]
    s = sin.to(dtype).to(tl.float32)[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    r1 = (x1 * c - x2 * s).to(dtype)
    r2 = (x2 * c + x1 * s).to(dtype)
    tl.store(ptrs, r1, mask=mask)
    tl.store(ptrs + HALF, r2, mask=mask)
    return r1, r2


@triton.jit
def load_halves(row_ptrs, offs_d, mask, HALF: tl.constexpr):
    """Rows of x as they are (x) and with their halves swapped (each element's partner in the
    rotation, xp), for rotate_loaded; a kernel that wants rotated rows in registers, not written
    back (decode attention's query and new key), asks for them early with this. row_ptrs: a
    pointer per row, broadcast against offs_d (the head dim's offsets); mask: which elements exist."""
    partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    return tl.load(row_ptrs + offs_d, mask=mask, other=0.0), tl.load(row_ptrs + partner, mask=mask, other=0.0)


@triton.jit
def load_cos_sin(cs_ptr, pos, cs_row_stride, offs_d, HALF: tl.constexpr):
    """cos and sin of each element of a head at position pos, float32 [BLOCK_D] (offs_d)."""
    j = tl.where(offs_d < HALF, offs_d, offs_d - HALF)  # the frequency of each element
    dmask = offs_d < 2 * HALF
    c = tl.load(cs_ptr + pos * cs_row_stride + j, mask=dmask, other=0.0)
    return c, tl.load(cs_ptr + pos * cs_row_stride + HALF + j, mask=dmask, other=0.0)


@triton.jit
def rotate_loaded(x, xp, c, s, first, scale):
    """Rows rotated as rotate_heads rotates their halves, from load_halves' x and xp and
    load_cos_sin's c and s (broadcast against x); first: which elements are in the first half.
    scale: a float32 factor x is first multiplied by and rounded to its dtype again (a norm folded
    into the projection, ops.RowNorm; 1.0 changes nothing). Returns the rows in x's dtype."""
    dtype = x.dtype
    c = c.to(dtype).to(tl.float32)
    s = s.to(dtype).to(tl.float32)
    x = (x.to(tl.float32) * scale).to(dtype).to(tl.float32)
    xp = (xp.to(tl.float32) * scale).to(dtype).to(tl.float32)
    # the first half: x1 c - x2 s; the second: x2 c + x1 s
    return tl.where(first, x * c - xp * s, x * c + xp * s).to(dtype)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cs_ptr,
    q_row_stride,
    q_head_stride,
    k_row_stride,
    k_head_stride,
    cs_row_stride,
    num_q_heads,
    num_k_heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    dmask = offs_d < HALF
    cos = tl.load(cs_ptr + pos * cs_row_stride + offs_d, mask=dmask, other=0.0)  # [BLOCK_HALF] float32
    sin = tl.load(cs_ptr + pos * cs_row_stride + HALF + offs_d, mask=dmask, other=0.0)
    rotate_heads(q_ptr, q_row_stride, q_head_stride, token, num_q_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HQ)
    rotate_heads(k_ptr, k_row_stride, k_head_stride, token, num_k_heads, cos, sin, HALF, BLOCK_HALF, BLOCK_HK)


_rotary_launch = launcher(_rotary_kernel)


def check_rotary_args(
    name: str, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
) -> None:
    """Input checks shared by the rotary kernels (alone and fused with the KV store)."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"{name}: q [T, Hq, D] and k [T, Hkv, D] expected, got {tuple(q.shape)} {tuple(k.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"{name}: q and k need a contiguous last dim")
    if q.dtype != k.dtype:
        raise ValueError(f"{name}: q and k dtypes differ ({q.dtype}, {k.dtype})")
    t, d = q.shape[0], q.shape[2]
    if d % 2 or cos_sin.dim() != 2 or cos_sin.shape[1] != d or cos_sin.stride(-1) != 1:
        raise ValueError(
            f"{name}: cos_sin must be [max_pos, {d}] with a contiguous last dim, got {tuple(cos_sin.shape)}"
        )
    if cos_sin.dtype != torch.float32:
        raise ValueError(f"{name}: cos_sin must be float32, got {cos_sin.dtype}")
    if positions.shape != (t,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: positions must be [{t}] int32/int64, got {tuple(positions.shape)} {positions.dtype}")


def rotary_(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place; positions [T] int; cos_sin [max_pos, D] float32."""
    check_rotary_args("rotary", q, k, positions, cos_sin)
    t, hq, d = q.shape
    if t == 0:
        return
    half = d // 2
    _rotary_launch[(t,)](
        q_ptr=q,
        k_ptr=k,
        pos_ptr=positions,
        cs_ptr=cos_sin,
        q_row_stride=q.stride(0),
        q_head_stride=q.stride(1),
        k_row_stride=k.stride(0),
        k_head_stride=k.stride(1),
        cs_row_stride=cos_sin.stride(0),
        num_q_heads=hq,
        num_k_heads=k.shape[1],
        HALF=half,
        BLOCK_HALF=next_pow2(half),
        BLOCK_HQ=next_pow2(hq),
        BLOCK_HK=next_pow2(k.shape[1]),
        num_warps=4,
    )
