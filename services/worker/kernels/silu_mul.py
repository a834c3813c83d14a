"""SiLU-and-multiply of the fused gate|up projection: [T, 2I] -> silu(gate) * up, [T, I].

Rounding follows ``TorchOps.silu_mul`` in a low-precision dtype: silu is computed in
float32 and rounded to the activation dtype, then the product is rounded again. Given a
RowNorm (the MLP's norm folded into gate_up's weights), gate and up are first scaled by the
inverse RMS of their row of the residual, each program computing it from that row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.fp8_quant_rows import ONE_PASS_MAX, Fp8Rows, launch_shape, quantize_row, row_pointers
from services.worker.kernels.launch import cdiv, launcher, next_pow2
from services.worker.kernels.rmsnorm import check_row_norm, row_inv_rms
from services.worker.models.layers.ops import RowNorm

BLOCK = 1024
ROWS_MAX = ONE_PASS_MAX  # the widest row quantized in the kernel: a program holds it all
# the widest residual row a folded norm's factor is computed from in one load (row_inv_rms):
# a loop of smaller tiles waits for each tile's load before it asks for the next
NORM_BLOCK = 8192


@triton.jit
def _silu_mul_kernel(
    x_ptr,
    out_ptr,
    res_ptr,
    q_ptr,
    qs_ptr,
    x_row_stride,
    out_row_stride,
    res_row_stride,
    inter,
    hidden,
    eps,
    BLOCK: tl.constexpr,
    NORM: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    QUANT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    dtype = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    up = tl.load(x_ptr + row * x_row_stride + inter + offs, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        r = row_inv_rms(res_ptr + row * res_row_stride, hidden, eps, NORM_BLOCK)
        gate = (gate * r).to(dtype).to(tl.float32)
        up = (up * r).to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    y = (act * up).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_row_stride + offs, y, mask=mask)
    if QUANT:  # one program a row (BLOCK covers it): the row in e4m3 too, fp8_quant_rows' bytes
        quantize_row(q_ptr + row * inter + offs, qs_ptr + row, y.to(tl.float32), mask)


_silu_mul_launch = launcher(_silu_mul_kernel)


def silu_mul(
    gate_up: torch.Tensor, out: torch.Tensor | None = None, norm: RowNorm | None = None, rows: Fp8Rows | None = None
) -> torch.Tensor:
    """gate_up: [T, 2I] (gate | up) -> [T, I]; norm: its src [T, H] in gate_up's dtype; rows: where
    the output's e4m3 rows go too (I at most ROWS_MAX: one program a row then)."""
    if gate_up.dim() != 2 or gate_up.stride(-1) != 1 or gate_up.shape[1] % 2:
        raise ValueError(f"silu_mul: gate_up must be [T, 2I] with a contiguous last dim, got {tuple(gate_up.shape)}")
    t, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    elif out.shape != (t, inter) or out.stride(-1) != 1 or out.dtype != gate_up.dtype:
        raise ValueError(f"silu_mul: out must be [{t}, {inter}] {gate_up.dtype} with a contiguous last dim")
    check_row_norm("silu_mul", "norm.src", norm, t, gate_up.dtype)
    if rows is not None:
        if inter > ROWS_MAX:
            raise ValueError(f"silu_mul: e4m3 rows need I <= {ROWS_MAX}, got {inter}")
        rows.check("silu_mul", t, inter)
    if t == 0:
        return out
    # with rows, one program a row: fp8_quant_rows' one-pass tile and warps for rows of I values
    block = next_pow2(inter) if rows is not None else min(BLOCK, next_pow2(inter))
    grid = (t, cdiv(inter, block))
    res, hidden, eps = (norm.src, norm.src.shape[1], norm.eps) if norm is not None else (gate_up, 0, 0.0)
    norm_block = min(NORM_BLOCK, next_pow2(max(hidden, 1)))
    _silu_mul_launch[grid](
        gate_up,
        out,
        res,
        *row_pointers(rows, out),
        gate_up.stride(0),
        out.stride(0),
        res.stride(0),
        inter,
        hidden,
        eps,
        BLOCK=block,
        NORM=norm is not None,
        NORM_BLOCK=norm_block,
        QUANT=rows is not None,
        num_warps=4 if rows is None else launch_shape(inter)[2],
    )
    return out
