"""Which BLAS library runs each projection of a captured decode step.

PyTorch sends a bf16 matmul to cuBLAS unless told to prefer cuBLASLt, and the two pick
different kernels for the skinny GEMMs of a decode step. Neither wins everywhere: on an
H200 at the Llama-3-8B shape (docs/benchmarks.md, r15) cuBLASLt moved the down projection's
weights 13 % faster at batch 64 and the o projection's 15 % faster at batch 32, while
cuBLAS was ahead elsewhere. So each batch-size bucket times both libraries on each
projection's real weights (every layer's, so the L2 cache cannot hold them) before its
graph is captured, and the capture calls each projection under the faster one. The graph
keeps the kernels it recorded; eager steps use PyTorch's default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

LIBRARIES = ("cublas", "cublaslt")


def time_matmuls(x: torch.Tensor, weights: list[torch.Tensor], library: str, reps: int) -> float:
    """Device ms for x @ w.t() over every w, preferring library, after one warm-up pass."""
    with prefer(library):
        for w in weights:
            x @ w.t()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            for w in weights:
                x @ w.t()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


# cuBLASLt must win by this much: near ties stay with PyTorch's default, so timing noise
# cannot flip a bucket's choice from one start to the next
MARGIN = 0.97


def choose_libraries(projections: dict[str, list[torch.Tensor]], batch: int, reps: int = 5) -> dict[str, str]:
    """For each projection (name -> its weight [N, K] in every layer), the library whose GEMMs
    of a [batch, K] input run fastest."""
    choice = {}
    for name, weights in projections.items():
        x = torch.randn(batch, weights[0].shape[1], dtype=weights[0].dtype, device=weights[0].device)
        blas, lt = (time_matmuls(x, weights, lib, reps) for lib in LIBRARIES)
        choice[name] = "cublaslt" if lt < MARGIN * blas else "cublas"
    return choice


@contextlib.contextmanager
def prefer(library: str | None) -> Iterator[None]:
    """Prefer library for the matmuls inside (None: leave the setting alone); restore after."""
    if library is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)
