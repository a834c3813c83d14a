"""Decode steps under CUDA graphs, one graph per batch-size bucket.

A decode step of an 8B model is a few hundred small kernels; launched one by one they
cost about as much host time as the step takes on the device. Each bucket's forward is
captured once over static input buffers; a step copies its inputs into the buffers (one copy
for a batch built in their layout, graph_inputs.py) and replays the smallest bucket that
holds it. Rows past the real batch are padding: they read and write only the pool's scratch
slot through the table's scratch row. Before a bucket is captured, what runs each projection
(a BLAS library, or one cuBLASLt algorithm) is chosen by timing (blas_choice.py); small buckets
check those choices in the whole captured step, and keep one only where the step is faster with it.
"""

from __future__ import annotations

import logging
import time

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.layers.projection import plain
from services.worker.runtime.blas_choice import (
    DEFAULT,
    LIBRARIES,
    Choice,
    choose,
    describe,
    projector,
    refine_in_step,
    replay_ms,
)
from services.worker.runtime.cublaslt import CublasLt
from services.worker.runtime.folding import StepForward
from services.worker.runtime.graph_inputs import DecodeInputs

log = logging.getLogger(__name__)

# buckets up to this size check their BLAS choices in the whole step (blas_choice.refine_in_step):
# a step of a few requests is mostly reading weights, where one product's choice shows
REFINE_MAX_BATCH = 16
DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def buckets_up_to(max_bs: int) -> list[int]:
    out = [b for b in DEFAULT_BUCKETS if b < max_bs]
    return [*out, max_bs] if max_bs <= DEFAULT_BUCKETS[-1] else [*out]


class DecodeGraphs:
    def __init__(
        self,
        step: StepForward,
        req_table: torch.Tensor,
        dummy_slot: int,
        dummy_row: int,
        max_context: int,
        buckets: list[int],
        device: torch.device,
        gemm_search: bool = True,
    ) -> None:
        self.step = step  # the forward a step runs, around the model
        self.model = step.model
        self.req_table = req_table
        self.dummy_slot = dummy_slot
        self.dummy_row = dummy_row
        self.max_context = max_context
        self.buckets = sorted(buckets)
        n = self.buckets[-1]
        self.inputs = DecodeInputs(n, dummy_slot, dummy_row, device)  # the static inputs, one buffer
        views = self.inputs.views(self.inputs.static)
        self.input_ids, self.positions, self.out_slots, self.rows, self.seq_lens, self.rotary_positions = views
        self.sample_index = torch.arange(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.blas: dict[int, dict[str, Choice]] = {}  # bucket -> projection -> what it was captured with
        self.lt: CublasLt | None = None
        self._capture_all(device, gemm_search)

    def fits(self, batch_size: int) -> bool:
        return 0 < batch_size <= self.buckets[-1]

    def bucket(self, batch_size: int) -> int:
        """The smallest captured batch size that holds batch_size requests."""
        return next(b for b in self.buckets if b >= batch_size)

    def described_blas(self, batch_size: int) -> dict[str, str]:
        """What each projection of the graph that runs batch_size requests was captured with, as text."""
        return {name: describe(c) for name, c in self.blas[self.bucket(batch_size)].items()}

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        n = batch.num_decodes
        bs = self.bucket(n)
        if not self.inputs.load(batch):  # a batch built in the graphs' layout comes with its padding
            self._copy_in(batch, n, bs)
        self.graphs[bs].replay()
        return self.logits[bs][:n]

    def _copy_in(self, batch: ForwardBatch, n: int, bs: int) -> None:
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.out_slots[:n].copy_(batch.out_slots)
        self.rows[:n].copy_(batch.decode_rows)
        self.seq_lens[:n].copy_(batch.decode_seq_lens)
        rotary = batch.rotary_positions
        self.rotary_positions[:n].copy_(rotary if rotary is not None else batch.positions)
        if bs > n:  # a larger step may have left real rows there
            self.out_slots[n:bs].fill_(self.dummy_slot)
            self.rows[n:bs].fill_(self.dummy_row)
            self.seq_lens[n:bs].fill_(1)
            self.rotary_positions[n:bs].fill_(0)

    def _batch(self, bs: int) -> ForwardBatch:
        # decode_max_len: the longest context fixes the split count of the captured kernels
        return ForwardBatch.decodes(
            self.input_ids[:bs],
            self.positions[:bs],
            self.out_slots[:bs],
            self.req_table,
            self.rows[:bs],
            self.seq_lens[:bs],
            self.max_context,
            self.sample_index[:bs],
            rotary_positions=self.rotary_positions[:bs],
        )

    def _capture_all(self, device: torch.device, gemm_search: bool) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        # None where cuBLASLt cannot be bound, was never tested or fails its self-test: libraries only
        self.lt = CublasLt.checked(device) if gemm_search else None  # kept while its graphs live
        for bs in reversed(self.buckets):  # largest first: the smaller ones reuse its memory
            chosen = choose(self.model.projections(), bs, self.lt, accumulate=self.step.accumulating(bs))
            if bs <= REFINE_MAX_BATCH and any(c != DEFAULT for c in chosen.values()):
                self.blas[bs], (self.graphs[bs], self.logits[bs]) = self._refined(bs, chosen, pool, stream, device)
            else:
                self.blas[bs] = chosen
                self.graphs[bs], self.logits[bs] = self._capture(bs, chosen, pool, stream, device)
        torch.cuda.synchronize(device)
        kinds = [c if c in LIBRARIES else "algorithm" for choice in self.blas.values() for c in choice.values()]
        log.info(
            "captured %d decode graphs (batch %d..%d) in %.1fs; projections on cuBLAS %d, cuBLASLt %d, "
            "a cuBLASLt algorithm called directly %d",
            len(self.graphs),
            self.buckets[0],
            self.buckets[-1],
            time.perf_counter() - t0,
            *(kinds.count(k) for k in (*LIBRARIES, "algorithm")),
        )

    def _refined(
        self, bs: int, chosen: dict[str, Choice], pool: tuple[int, int], stream: torch.cuda.Stream, device: torch.device
    ) -> tuple[dict[str, Choice], tuple[torch.cuda.CUDAGraph, torch.Tensor]]:
        """The choices refine_in_step keeps, timing whole captured steps; -> (them, their capture).
        The other captures are released to the pool for the next bucket."""
        captured: dict[str, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

        def key(choice: dict[str, Choice]) -> str:
            return repr(sorted((name, describe(c)) for name, c in choice.items()))

        def step_ms(choice: dict[str, Choice]) -> float:
            if key(choice) not in captured:
                captured[key(choice)] = self._capture(bs, choice, pool, stream, device)
            return replay_ms(captured[key(choice)][0])

        kept = refine_in_step(chosen, step_ms)
        graph = captured.pop(key(kept))
        for other, _ in captured.values():
            other.reset()
        return kept, graph

    def _capture(
        self,
        bs: int,
        choice: dict[str, Choice],
        pool: tuple[int, int],
        stream: torch.cuda.Stream,
        device: torch.device,
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """A graph of one decode step of bs requests, its projections run by choice; -> (graph,
        its logits [bs, V])."""
        batch = self._batch(bs)
        self.model.project = projector(choice, self.lt)
        try:
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile kernels and settle allocations outside the graph
                    self.step(batch)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                logits = self.step(batch)
        finally:
            self.model.project = plain  # eager steps: nothing to look up on the hot path
        return graph, logits
