"""GELU-and-multiply of the fused gate|up projection (Gemma's GeGLU): [T, 2I] -> gelu(gate) * up,
[T, I], GELU by its tanh approximation (Hugging Face's gelu_pytorch_tanh).

Rounding follows ``TorchOps.gelu_tanh_mul`` in a low-precision dtype: the activation is computed
in float32 and rounded to the activation dtype, then the product is rounded again. The tanh
form 0.5 x (1 + tanh(y)) is computed as x * sigmoid(2y), the same function.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher, next_pow2

BLOCK = 1024
SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)


@triton.jit
def _gelu_tanh_mul_kernel(x_ptr, out_ptr, x_row_stride, out_row_stride, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    dtype = x_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * x_row_stride + offs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK]
    up = tl.load(x_ptr + row * x_row_stride + inter + offs, mask=mask, other=0.0).to(tl.float32)
    y = SQRT_2_OVER_PI * (gate + 0.044715 * gate * gate * gate)
    act = (gate * tl.sigmoid(2.0 * y)).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * out_row_stride + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


_gelu_tanh_mul_launch = launcher(_gelu_tanh_mul_kernel)


def gelu_tanh_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up: [T, 2I] (gate | up) -> [T, I]."""
    if gate_up.dim() != 2 or gate_up.stride(-1) != 1 or gate_up.shape[1] % 2:
        raise ValueError(
            f"gelu_tanh_mul: gate_up must be [T, 2I] with a contiguous last dim, got {tuple(gate_up.shape)}"
        )
    t, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if out is None:
        out = torch.empty((t, inter), dtype=gate_up.dtype, device=gate_up.device)
    elif out.shape != (t, inter) or out.stride(-1) != 1 or out.dtype != gate_up.dtype:
        raise ValueError(f"gelu_tanh_mul: out must be [{t}, {inter}] {gate_up.dtype} with a contiguous last dim")
    if t == 0:
        return out
    block = min(BLOCK, next_pow2(inter))
    _gelu_tanh_mul_launch[(t, cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block, num_warps=4
    )
    return out
