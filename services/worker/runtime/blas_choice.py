"""What runs each projection of a captured decode step: PyTorch's matmul under cuBLAS or cuBLASLt,
or one cuBLASLt algorithm called directly (cublaslt.py).

PyTorch sends a bf16 matmul to cuBLAS unless told to prefer cuBLASLt, and each library runs
the first algorithm its heuristic names. For a decode step's skinny GEMMs that is often not
the fastest: on an H200 at the Llama-3-8B shape, cuBLASLt moved the down projection's weights
13 % faster than cuBLAS at batch 64, and the heuristic's own algorithms with K left unsplit
ran the o and down projections 1-2.5 µs faster at batches 1-16, its split's separate reduce
costing more than the split gains. So each batch-size
bucket times the candidates on each projection's real weights (several layers', so the L2
cache cannot hold them), each replayed from a CUDA graph as the step will be, before the
bucket's graph is captured, and the capture runs each projection with the fastest. The graph
keeps the kernels it recorded; eager steps use PyTorch's default.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from services.worker.models.layers.projection import Project, matmul
from services.worker.runtime.cublaslt import Algo, CublasLt

LIBRARIES = ("cublas", "cublaslt")
DEFAULT = "cublas"  # what PyTorch's matmul runs unless told otherwise
Choice = str | Algo  # a library for PyTorch's matmul, or one cuBLASLt algorithm

# another choice must beat PyTorch's default by this much: near ties stay with the default, so
# timing noise cannot flip a bucket's choice from one start to the next
MARGIN = 0.97


def describe(choice: Choice) -> str:
    """A library's name, or an algorithm's settings."""
    return choice if isinstance(choice, str) else choice.describe()


def graph_ms(fn: Callable[[], object], reps: int = 10) -> float:
    """Device ms of one replay of a CUDA graph of fn (run once outside it first), over reps replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    return replay_ms(graph, warm=1, reps=reps)


def replay_ms(graph: torch.cuda.CUDAGraph, warm: int = 3, reps: int = 20) -> float:
    """Device ms of one replay of graph, over reps replays after warm ones."""
    for _ in range(warm):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def choose(
    projections: dict[str, list[torch.Tensor]],
    batch: int,
    lt: CublasLt | None,
    layers: int = 8,
    reps: int = 3,
    accumulate: frozenset[str] = frozenset(),
) -> dict[str, Choice]:
    """For each projection (name -> its weight [N, K] in every layer), what runs the GEMMs of a
    [batch, K] input fastest over its first `layers` layers: a library, or (lt given) one of
    lt.candidates. PyTorch's default (cuBLAS) unless another is at least 3 % faster. The
    projections named in accumulate are timed adding into their output, as the step runs them
    (a GEMM with beta 1 may get another kernel from a library's heuristic than one with beta 0)."""
    return {
        # an int4 or fp8 weight has its own product (layers/projection.py), whatever is chosen
        name: _fastest(weights[:layers], batch, lt, reps, name in accumulate)
        if isinstance(weights[0], torch.Tensor)
        else DEFAULT
        for name, weights in projections.items()
    }


def refine_in_step(
    chosen: dict[str, Choice], step_ms: Callable[[dict[str, Choice]], float], tolerance: float = 0.002
) -> dict[str, Choice]:
    """The choices checked in the whole step, one projection at a time: each that is not
    PyTorch's default is put back on the default, and stays there unless its own choice made the
    step (step_ms: device ms of one step captured with the given choices) faster by more than
    tolerance. A product timed alone can win and still slow the step it runs in (on an H200 at
    batch 1, a cuBLASLt variant for QKV timed over 3 % faster alone and made the step 0.2 ms
    slower), so the step has the last word."""
    best = dict(chosen)
    best_ms = step_ms(best)
    for name, choice in chosen.items():
        if choice == DEFAULT:
            continue
        trial = {**best, name: DEFAULT}
        ms = step_ms(trial)
        if ms <= best_ms * (1 + tolerance):
            best, best_ms = trial, ms
    return best


def _fastest(ws: list[torch.Tensor], batch: int, lt: CublasLt | None, reps: int, accumulate: bool) -> Choice:
    x = torch.randn(batch, ws[0].shape[1], dtype=ws[0].dtype, device=ws[0].device)
    # zeros: an accumulating product's output stays finite over the timing's replays
    pairs = [(w, torch.zeros(batch, w.shape[0], dtype=w.dtype, device=w.device)) for w in ws]
    choices: list[Choice] = [*LIBRARIES, *(lt.candidates(x, *pairs[0]) if lt is not None else [])]
    timed = [(time_choice(c, lt, x, pairs, reps, accumulate), c) for c in choices]
    best_ms, best = min(timed, key=lambda t: t[0])
    return best if best_ms < MARGIN * timed[0][0] else DEFAULT


def time_choice(
    choice: Choice,
    lt: CublasLt | None,
    x: torch.Tensor,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    reps: int,
    accumulate: bool = False,
) -> float:
    """Device ms of x @ w.t() into o (accumulate: added to o) for every (w, o) of pairs, by what
    choice names, replayed from a CUDA graph."""
    return graph_ms(lambda: [run(choice, lt, x, w, o, accumulate) for w, o in pairs], reps)


def run(
    choice: Choice,
    lt: CublasLt | None,
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None,
    accumulate: bool = False,
) -> torch.Tensor:
    """x @ w.t() (into out when given; accumulate: added to out) by what choice names."""
    if isinstance(choice, Algo):
        assert lt is not None, "a cuBLASLt algorithm was chosen without a handle to run it"
        return lt.matmul(x, w, x.new_empty(x.shape[0], w.shape[0]) if out is None else out, choice, accumulate)
    with prefer(choice):
        return matmul(x, w, out, accumulate)


def projector(choices: dict[str, Choice], lt: CublasLt | None) -> Project:
    """A model's projection strategy that runs each projection by name with what choices says."""

    def project(
        name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False
    ) -> torch.Tensor:
        return run(choices[name], lt, x, w, out, accumulate)

    return project


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
