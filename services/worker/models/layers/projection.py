"""A projection x @ w.t(), as the model asks for one: by name, so that whoever runs the model
can choose what computes each (the runtime's BLAS choice under CUDA graphs) without the
model's code knowing. A weight-only int4 weight (models/int4_weight.py) goes to its own
product whatever the strategy: the Triton kernel on CUDA, the reference elsewhere; an FP8
weight (models/fp8_weight.py) to layers/fp8_product.py: the FP8 tensor cores, else the reference."""

from __future__ import annotations

from typing import Protocol

import torch

from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.int4_weight import Int4Weight, int4_reference
from services.worker.models.layers.fp8_product import fp8_matmul


class Project(Protocol):
    def __call__(
        self, name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False
    ) -> torch.Tensor:
        """x [T, K] @ w [N, K].t() -> [T, N] (into out when given; accumulate: added to out)."""
        ...


def matmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """x @ w.t() (w stored [N, K]) by PyTorch, into out when given; accumulate: out += x @ w.t(),
    one GEMM with beta 1 (out's old value is read by the GEMM, not by a kernel of its own)."""
    if isinstance(w, Int4Weight):
        return int4_matmul(x, w, out, accumulate)
    if isinstance(w, Fp8Weight):
        return fp8_matmul(x, w, out, accumulate)
    if accumulate:
        assert out is not None, "accumulate needs out"
        return out.addmm_(x, w.t())
    return x @ w.t() if out is None else torch.mm(x, w.t(), out=out)


def int4_matmul(x: torch.Tensor, w: Int4Weight, out: torch.Tensor | None, accumulate: bool) -> torch.Tensor:
    if x.is_cuda:
        # imported here: the kernels compile for the device they first see
        from services.worker.kernels.int4_matmul import int4_matmul as kernel

        return kernel(x, w, out, accumulate)
    return int4_reference(x, w, out, accumulate)


def plain(
    name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False
) -> torch.Tensor:
    """Every projection by PyTorch's matmul, whatever its name."""
    return matmul(x, w, out, accumulate)
