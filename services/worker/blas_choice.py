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
from collections.abc import Callable, Iterator

import torch

LIBRARIES = ("cublas", "cublaslt")


def graph_ms(fn: Callable[[], object], reps: int = 10) -> float:
    """Device ms of fn's kernels replayed from a CUDA graph (fn run once first, outside it, on
    the capture stream: kernels compile, workspaces settle), over reps replays after one."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def time_matmuls(x: torch.Tensor, weights: list[torch.Tensor], library: str, reps: int) -> float:
    """Device ms for x @ w.t() over every w, preferring library, replayed from a CUDA graph as a
    decode graph runs them. Timed eagerly instead, the two libraries came out within the 3 %
    margin on the down projection at batch 256, and one engine of two took cuBLASLt, whose
    kernel then took 2.19 ms a step in its graph against cuBLAS's 1.69 (docs/benchmarks.md, r71).
    One output buffer serves every layer's product, so the graph holds no more memory."""
    out = torch.empty(x.shape[0], weights[0].shape[0], dtype=x.dtype, device=x.device)

    def run() -> None:
        for w in weights:
            torch.mm(x, w.t(), out=out)

    with prefer(library):
        return graph_ms(run, reps)


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
