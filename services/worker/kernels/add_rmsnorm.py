"""Fused residual add and RMSNorm: residual += x (in place), then RMSNorm of the new residual.

One program per token row reads x and residual once and writes the residual and the
normalised output, instead of the three passes of the unfused version. The sum is rounded
to the residual's dtype before it is normalised, as ``TorchOps.add_rmsnorm`` (an in-place
``add_``) does; the weight applies as rmsnorm.py's does (UNIT_OFFSET: Gemma's 1 + weight).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.fp8_quant_rows import Fp8Rows, quantize_row, row_pointers
from services.worker.kernels.launch import launcher
from services.worker.kernels.rmsnorm import norm_output, row_launch_params, weighted


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    q_ptr,
    qs_ptr,
    x_row_stride,
    res_row_stride,
    out_row_stride,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    UNIT_OFFSET: tl.constexpr,
    QUANT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    r = tl.load(res_ptr + row * res_row_stride + offs, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row * res_row_stride + offs, s, mask=mask)
    s = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(s * s, axis=0) / hidden + eps)
    y = weighted(s, rstd, w_ptr, offs, mask, res_ptr.dtype.element_ty, UNIT_OFFSET).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_row_stride + offs, y, mask=mask)
    if QUANT:  # the output row in e4m3 too, for an FP8 product that reads it (fp8_quant_rows' bytes)
        quantize_row(q_ptr + row * hidden + offs, qs_ptr + row, y.to(tl.float32), mask)


_add_rmsnorm_launch = launcher(_add_rmsnorm_kernel)


def add_rmsnorm_(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    unit_offset: bool = False,
    rows: Fp8Rows | None = None,
) -> torch.Tensor:
    """x, residual: [T, H], weight: [H]. Updates residual in place; returns [T, H] normalised
    (unit_offset: Gemma's norm, times 1 + weight). rows: where the output's e4m3 rows go too."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"add_rmsnorm: x must be [T, H] with a contiguous last dim, got {tuple(x.shape)}")
    t, h = x.shape
    if residual.shape != (t, h) or residual.stride(-1) != 1:
        raise ValueError(f"add_rmsnorm: residual must be [{t}, {h}] with a contiguous last dim")
    out = norm_output("add_rmsnorm", x, weight, residual.dtype, out, rows)
    if t == 0:
        return out
    block, num_warps = row_launch_params(h)
    _add_rmsnorm_launch[(t,)](
        x,
        residual,
        weight,
        out,
        *row_pointers(rows, out),
        x.stride(0),
        residual.stride(0),
        out.stride(0),
        h,
        eps,
        BLOCK=block,
        UNIT_OFFSET=unit_offset,
        QUANT=rows is not None,
        num_warps=num_warps,
    )
    return out
