"""x @ W.t() for an Fp8Weight (models/fp8_weight.py): on a GPU with e4m3 (compute capability 8.9
or more), a Triton kernel for products of up to TRITON_MAX_M rows and the FP8 tensor cores past
that; else the reference (dequantize, then PyTorch's matmul).

Up to TRITON_MAX_M rows (decode batches, short prefill chunks) the product is a read of the
weight, and kernels/fp8_weight_matmul.py reads it with x left in bf16: one launch (two when K is
split), no activation quantization. cuBLASLt's FP8 kernels behind torch._scaled_mm are slow at
such M, and quantizing x adds a launch to every projection. The choice is by x's row count, a
shape: a decode graph (one per batch size) or a piecewise graph (one per token bucket) captures
the kernel its size chose, and replays it. TRITON_MAX_M is where the two cross on
an H200 (tools/bench_kernels.py --parts ceilings,quant_gemm times both at M = 1, 16, 64, 256).

Past it, where kernels/gemm_tiles.py's FP8_TILES holds a tile for the shape and row bucket (an
x8 tile that tools/kernel_quant_sweep.py found faster than torch._scaled_mm there), the same
kernel quantizes x per token and multiplies e4m3 by e4m3 on the tensor cores. Elsewhere the FP8
product quantizes x per token on the fly (each row's absmax / 448, e4m3; one Triton
kernel, kernels/fp8_quant_rows.py, whose reference is quantize_tokens) and runs
torch._scaled_mm with row-wise scales: x's [T, 1] and the weight's [1, N], the float32 sums
scaled and rounded once to bf16. Everything is a plain device op with no host sync, so the
decode and piecewise CUDA graphs capture it.

torch._scaled_mm is private: it is used only on the torch versions it was tested with (row-wise
scales since 2.5), on GPUs of compute capability 8.9 or more, for bf16 activations and widths
that are multiples of 16 (its own requirement); anything else takes the reference, which is also
the CPU path (so CPU results equal Hugging Face's on the dequantized weights exactly).
"""

from __future__ import annotations

import functools
import logging

import torch

from services.worker.models.fp8_weight import FP8_MAX, MIN_SCALE, Fp8Weight, fp8_reference, to_fp8

log = logging.getLogger(__name__)

# rows up to which the Triton kernel runs the product, past which torch._scaled_mm unless FP8_TILES
# has a tile for the shape: on the H200 at Llama-3-8B's projections (4ec4781) the kernel with bf16
# activations is faster for all four at M = 16 and slower in sum at M = 64 (146 against 131 us a
# layer); its x8 tiles (e4m3 activations) are swept against _scaled_mm past 16 rows
TRITON_MAX_M = 16
TESTED_TORCH = ((2, 5), (2, 13))  # the releases torch._scaled_mm's row-wise form was tested with, inclusive


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


@functools.cache
def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether device runs torch._scaled_mm as it was tested: a CUDA GPU of compute capability
    8.9 or more (Ada, Hopper, Blackwell) under a tested torch."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return False
    lo, hi = TESTED_TORCH
    if not hasattr(torch, "_scaled_mm") or not lo <= _torch_version() <= hi:
        log.warning(
            "torch %s: FP8 products dequantize instead (torch._scaled_mm tested on %s)", torch.__version__, TESTED_TORCH
        )
        return False
    return True


@functools.cache
def fp8_triton(device: torch.device) -> bool:
    """Whether Triton can convert e4m3 on device: a CUDA GPU of compute capability 8.9 or more."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (e4m3 [T, K], float32 scales [T, 1]): each token's absmax / 448."""
    amax = x.abs().amax(1, keepdim=True).float()
    # divided by a tensor: PyTorch's CUDA division by a Python number multiplies by its reciprocal
    # (off by an ulp at times), where the kernel divides exactly
    scale = (amax / torch.full_like(amax, FP8_MAX)).clamp(min=MIN_SCALE)  # [T, 1]
    return to_fp8(x.float() / scale), scale


def tokens_as_quantized(x: torch.Tensor) -> torch.Tensor:
    """x [T, K] -> float32 [T, K]: what a product with e4m3 activations multiplies, x quantized
    per token (quantize_tokens) and scaled back; the reference's x for such a product."""
    xq, xs = quantize_tokens(x)
    return xq.float() * xs


def quantizes_rows(m: int) -> bool:
    """Whether every FP8 product of m rows on a GPU with e4m3 quantizes x per token: past
    TRITON_MAX_M rows, where each of FP8_TILES' tiles for m's row bucket is an x8 tile (a shape
    without one runs torch._scaled_mm, which quantizes x too)."""
    from services.worker.kernels.gemm_tiles import m_bucket

    return m > TRITON_MAX_M and _all_x8(m_bucket(m))


@functools.cache
def _all_x8(bucket: int | None) -> bool:
    """Each of FP8_TILES' tiles for the row bucket is an x8 tile: read once a bucket, not at
    every norm of an eager step (the table is fixed)."""
    from services.worker.kernels.gemm_tiles import FP8_TILES

    return all(t.x8 for (_, _, b), t in FP8_TILES.items() if b == bucket)


def scaled_mm_fits(x: torch.Tensor, w: Fp8Weight) -> bool:
    n, k = w.shape
    return x.dtype == torch.bfloat16 and k % 16 == 0 and n % 16 == 0 and fp8_tensor_cores(x.device)


def fp8_scaled_mm(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """x [T, K] bf16 @ W.t() -> [T, N] bf16 on the FP8 tensor cores (scaled_mm_fits(x, w) must hold);
    x quantized by kernels/fp8_quant_rows.py, quantize_tokens in one launch."""
    # imported here: the kernels compile for the device they first see
    from services.worker.kernels.fp8_quant_rows import attached_rows, fp8_quant_rows

    xq, xs = attached_rows(x) or fp8_quant_rows(x if x.stride(-1) == 1 else x.contiguous())
    # w.weight [N, K] row-major is the [K, N] column-major operand _scaled_mm wants
    return torch._scaled_mm(xq, w.weight.t(), scale_a=xs, scale_b=w.scale[None, :], out_dtype=x.dtype)


def triton_fits(x: torch.Tensor, w: Fp8Weight) -> bool:
    """Whether the Triton kernel runs x's product: bf16 or fp16 on a GPU with e4m3 (the CPU keeps
    the reference: its results are Hugging Face's exactly), of up to TRITON_MAX_M rows, or more
    where FP8_TILES holds a tile for the shape (one that beat torch._scaled_mm there)."""
    from services.worker.kernels.gemm_tiles import FP8_TILES, has_tile

    m = x.shape[0]
    if m == 0 or x.dtype not in (torch.bfloat16, torch.float16) or not fp8_triton(x.device):
        return False
    return m <= TRITON_MAX_M or has_tile(FP8_TILES, m, *w.shape)


def fp8_matmul(x: torch.Tensor, w: Fp8Weight, out: torch.Tensor | None, accumulate: bool) -> torch.Tensor:
    """x [T, K] @ W.t() -> [T, N] (into out when given; accumulate: added to out)."""
    if triton_fits(x, w):
        # imported here: the kernels compile for the device they first see
        from services.worker.kernels.fp8_weight_matmul import fp8_weight_matmul

        return fp8_weight_matmul(x if x.stride(-1) == 1 else x.contiguous(), w, out, accumulate)
    if x.shape[0] == 0 or not scaled_mm_fits(x, w):
        return fp8_reference(x, w, out, accumulate)
    y = fp8_scaled_mm(x, w)
    if out is None:
        assert not accumulate, "accumulate needs out"
        return y
    return out.add_(y) if accumulate else out.copy_(y)
