"""A projection x @ w.t(), as the model asks for one: by name, so that whoever runs the model
can choose what computes each (the runtime's BLAS choice under CUDA graphs) without the
model's code knowing."""

from __future__ import annotations

from typing import Protocol

import torch


class Project(Protocol):
    def __call__(
        self, name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False
    ) -> torch.Tensor:
        """x [T, K] @ w [N, K].t() -> [T, N] (into out when given; accumulate: added to out)."""
        ...


def matmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """x @ w.t() (w stored [N, K]) by PyTorch, into out when given; accumulate: out += x @ w.t(),
    one GEMM with beta 1 (out's old value is read by the GEMM, not by a kernel of its own)."""
    if accumulate:
        assert out is not None, "accumulate needs out"
        return out.addmm_(x, w.t())
    return x @ w.t() if out is None else torch.mm(x, w.t(), out=out)


def plain(
    name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False
) -> torch.Tensor:
    """Every projection by PyTorch's matmul, whatever its name."""
    return matmul(x, w, out, accumulate)
