"""RMSNorm as one Triton kernel: weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype).

One program per token row: a row (hidden size up to 8192) fits in registers, so x is read
once. The arithmetic follows ``TorchOps.rmsnorm`` (Hugging Face): float32 statistics, the
normalised row rounded to the activation dtype before the weight multiply; or, with
UNIT_OFFSET (Gemma's), the float32 row times 1 + weight, rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.fp8_quant_rows import Fp8Rows, quantize_row, row_pointers
from services.worker.kernels.launch import launcher, next_pow2
from services.worker.models.layers.ops import RowNorm


@triton.jit
def weighted(x, rstd, w_ptr, offs, mask, dtype, UNIT_OFFSET: tl.constexpr):
    """The normalised row x * rstd (float32) times the norm's weight w_ptr[offs]: Llama's
    rounds the row to dtype first (and loads the weight after it, as it always has: the same
    compiled kernel); Gemma's (UNIT_OFFSET) multiplies by 1 + weight in float32."""
    if UNIT_OFFSET:
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return x * rstd * (1.0 + w)
    else:
        normed = (x * rstd).to(dtype).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return normed * w


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    q_ptr,
    qs_ptr,
    x_row_stride,
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
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = weighted(x, rstd, w_ptr, offs, mask, x_ptr.dtype.element_ty, UNIT_OFFSET).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_row_stride + offs, y, mask=mask)
    if QUANT:  # the output row in e4m3 too, for an FP8 product that reads it (fp8_quant_rows' bytes)
        quantize_row(q_ptr + row * hidden + offs, qs_ptr + row, y.to(tl.float32), mask)


_rmsnorm_launch = launcher(_rmsnorm_kernel)


@triton.jit
def row_inv_rms(row_ptr, hidden, eps, BLOCK: tl.constexpr):
    """rsqrt(mean(x^2) + eps), float32, of one row of `hidden` elements read BLOCK at a time:
    for a kernel that applies a norm folded into the product before it (ops.RowNorm). With
    hidden 0 it reads nothing (and returns rsqrt(eps))."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, hidden, BLOCK):
        x = tl.load(row_ptr + start + offs, mask=start + offs < hidden, other=0.0).to(tl.float32)
        acc += x * x
    return tl.rsqrt(tl.sum(acc, axis=0) / tl.maximum(hidden, 1) + eps)


def check_row_norm(where: str, name: str, norm: RowNorm | None, rows: int, dtype: torch.dtype) -> None:
    """A folded norm's src must be [rows, H] of the activations' dtype with a contiguous last dim
    (row_inv_rms reads a row of it as one run); nothing to check without a norm."""
    if norm is None:
        return
    src = norm.src
    if src.dim() != 2 or src.shape[0] != rows or src.stride(-1) != 1 or src.dtype != dtype:
        raise ValueError(
            f"{where}: {name} must be [{rows}, H] {dtype} with a contiguous last dim, "
            f"got {tuple(src.shape)} {src.dtype}"
        )


def row_launch_params(hidden: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for a kernel that keeps one row of `hidden` elements in registers."""
    block = next_pow2(hidden)
    num_warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    return block, num_warps


def norm_output(
    where: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None,
    rows: Fp8Rows | None,
) -> torch.Tensor:
    """A norm's output for x [T, H]: out checked ([T, H], last dim contiguous), else a new one in
    weight's and dtype's promoted dtype; weight ([H], contiguous) and rows checked too."""
    t, h = x.shape
    if weight.shape != (h,) or not weight.is_contiguous():
        raise ValueError(f"{where}: weight must be contiguous [{h}], got {tuple(weight.shape)}")
    if out is None:
        out = torch.empty((t, h), dtype=torch.promote_types(weight.dtype, dtype), device=x.device)
    elif out.shape != (t, h) or out.stride(-1) != 1:
        raise ValueError(f"{where}: out must be [{t}, {h}] with a contiguous last dim, got {tuple(out.shape)}")
    if rows is not None:
        rows.check(where, t, h)
    return out


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    unit_offset: bool = False,
    rows: Fp8Rows | None = None,
) -> torch.Tensor:
    """x: [T, H], weight: [H] -> [T, H] in the promoted dtype of weight and x. unit_offset: Gemma's
    norm, times 1 + weight. rows: where the output's e4m3 rows go too."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"rmsnorm: x must be [T, H] with a contiguous last dim, got {tuple(x.shape)} {x.stride()}")
    t, h = x.shape
    out = norm_output("rmsnorm", x, weight, x.dtype, out, rows)
    if t == 0:
        return out
    block, num_warps = row_launch_params(h)
    _rmsnorm_launch[(t,)](
        x,
        weight,
        out,
        *row_pointers(rows, out),
        x.stride(0),
        out.stride(0),
        h,
        eps,
        BLOCK=block,
        UNIT_OFFSET=unit_offset,
        QUANT=rows is not None,
        num_warps=num_warps,
    )
    return out
