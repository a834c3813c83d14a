"""The token bitmask of a step's constrained requests: filled on the host, applied on the device.

xgrammar writes each constrained request's allowed next tokens as a bitmask row (one bit per
token, int32 words) into a host buffer, in fill threads for a batch; the rows go to the
device in one copy and mask the logits in place (disallowed tokens to -inf) before sampling.
Only the constrained rows are filled, copied and masked: a step without constrained requests
does none of this, and unconstrained rows of a step with some are left as they are.

The rows are filled in a thread of their own (``begin``), beside the step loop's build and
launch of the step's forward: the fill waits for the step in flight (its tokens advance the
grammars) and xgrammar's fill lets go of the interpreter, so on a step whose launch keeps the
host busy (a mixed prefill step, launched kernel by kernel) the fill costs the step nothing.
``finish`` waits for the rows and queues their copy to the device, in the step loop's thread
and stream.

The fill is cut into chunks of rows, one per fill thread, each chunk filled by a batch matcher
of one thread of its own: xgrammar's own threads (BatchGrammarMatcher(max_threads=n)) did not
fill faster than one here (4.7 ms against 4.4 for 1,500 rows, two cores), while two chunks in
two threads took 2.9 ms, since each chunk's fill lets go of the interpreter. At a batch of
1,500 JSON-schema rows of a 128k vocabulary one thread takes about 13 ms a step, longer than
the decode step it should hide behind. The grammars' advance (xgrammar's accept) holds the
interpreter and stays in the mask thread.

A step whose forward fails does not wait for its fill: the fill may wait for a step the device
never ends (a tensor-parallel peer died in its all-reduce), so the threads are daemons, and
they cannot hold the failing worker at its exit.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import torch
import xgrammar as xgr

from services.worker.grammar import GrammarState
from services.worker.host_copy import to_device

MIN_CHUNK_ROWS = 64  # fewer rows per fill thread than this are not worth handing over


@dataclass
class StepMask:
    """The bitmask rows of one step, on the logits' device."""

    bitmask: torch.Tensor  # [rows, ceil(V / 32)] int32; row i masks logits row i
    # the sample indices it applies to: on CUDA a device tensor, since xgrammar would copy a list
    # from pageable memory, and such a copy waits for the device to finish the step's forward
    rows: list[int] | torch.Tensor
    vocab_size: int

    def apply(self, logits: torch.Tensor) -> None:
        """logits: [S, V], masked in place."""
        xgr.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=self.vocab_size, indices=self.rows)


@dataclass
class Filling:
    """A step's fill under way: its grammars advanced (the step loop may read their state), and
    the rows filled (the sample indices that have a mask)."""

    advanced: Future[None]
    rows: Future[list[int]]


class TokenMasks:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device, fill_threads: int = 1) -> None:
        self.vocab_size = vocab_size
        self.device = device
        shape = xgr.get_bitmask_shape(max_rows, vocab_size)
        cuda = device.type == "cuda"
        self.host = torch.full(shape, -1, dtype=xgr.bitmask_dtype, pin_memory=cuda)  # [rows, W]
        self.dev = torch.empty(shape, dtype=xgr.bitmask_dtype, device=device) if cuda else self.host
        # one batch matcher per fill thread; the mask thread fills the first chunk itself
        self.batches = [xgr.BatchGrammarMatcher(max_threads=1) for _ in range(max(1, fill_threads))]
        self._thread = _MaskThread("token-mask")
        self._helpers = [_MaskThread(f"token-mask-{i}") for i in range(1, len(self.batches))]

    def begin(self, advance: Callable[[], None], states: list[tuple[int, GrammarState]]) -> Filling:
        """Start filling the rows of states ((sample index, grammar) of the step's constrained
        requests) in the mask thread: first ``advance`` (the grammars take the tokens of the step
        in flight, waiting for them), then the fill. The caller must not touch those grammars
        until ``advanced`` is done, nor call a matcher until ``finish``. The host buffer is free
        then: the step in flight held its last copy."""
        filling = Filling(Future(), Future())
        filling.rows = self._thread.submit(self._fill, advance, states, filling.advanced)
        return filling

    def finish(self, filling: Filling) -> StepMask | None:
        """The rows begun, on the device (the copy queued on the caller's stream); None when no
        row needs a mask (every grammar has ended: their tokens are dropped)."""
        rows = filling.rows.result()
        if not rows:
            return None
        n = max(rows) + 1
        if self.dev is self.host:
            return StepMask(self.host[:n], rows, self.vocab_size)
        self.dev[:n].copy_(self.host[:n], non_blocking=True)
        return StepMask(self.dev[:n], to_device(rows, torch.int32, self.device), self.vocab_size)

    def _fill(self, advance: Callable[[], None], states: list[tuple[int, GrammarState]], advanced: Future) -> list[int]:
        try:
            advance()
        except BaseException as e:
            advanced.set_exception(e)
            raise
        advanced.set_result(None)
        live = [(i, s.matcher) for i, s in states if s.needs_mask]
        rows = [i for i, _ in live]
        chunks = _chunks(len(live), len(self.batches))
        helped = [
            helper.submit(self._fill_chunk, batch, live[lo:hi])
            for helper, batch, (lo, hi) in zip(self._helpers, self.batches[1:], chunks[1:], strict=False)
        ]
        if chunks:
            self._fill_chunk(self.batches[0], live[chunks[0][0] : chunks[0][1]])
        for done in helped:
            done.result()
        return rows

    def _fill_chunk(self, batch: xgr.BatchGrammarMatcher, live: list[tuple[int, xgr.GrammarMatcher]]) -> None:
        batch.batch_fill_next_token_bitmask([m for _, m in live], self.host, [i for i, _ in live])


def _chunks(n: int, threads: int) -> list[tuple[int, int]]:
    """[lo, hi) bounds cutting n rows into at most ``threads`` chunks of MIN_CHUNK_ROWS or more
    (one chunk when n is smaller), the same size within a row; none when n is 0."""
    k = max(1, min(threads, n // MIN_CHUNK_ROWS))
    if n == 0:
        return []
    bounds = [n * j // k for j in range(k + 1)]
    return list(itertools.pairwise(bounds))


class _MaskThread:
    """One daemon thread that runs the fills in order (a ThreadPoolExecutor's thread would be
    joined at exit)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn: Callable, *args) -> Future:
        done: Future = Future()
        self._jobs.put((done, fn, args))
        return done

    def _run(self) -> None:
        while True:
            done, fn, args = self._jobs.get()
            try:
                done.set_result(fn(*args))
            except BaseException as e:  # the step loop's finish() raises it
                done.set_exception(e)
