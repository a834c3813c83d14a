"""Per-request sampling parameters on the device, one row per request-table row.

A request's parameters are written once, when it gets its row; a step then needs only
the rows of the requests it samples. The output position (for seeded draws) and, when
some request uses penalties, its token counts and seen-token marks are updated on the
device after every draw, so the host never has to know a token before the next step
is sampled: the CPU can prepare step N+1 while the GPU still runs step N.
"""

from __future__ import annotations

import torch

from services.worker.host_copy import to_device
from services.worker.request import Req


class SamplingState:
    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.device = device
        self.temperature = torch.ones(rows, device=device)  # [rows]
        self.top_p = torch.ones(rows, device=device)
        self.min_p = torch.zeros(rows, device=device)
        self.top_k = torch.full((rows,), vocab, dtype=torch.int64, device=device)
        self.greedy = torch.ones(rows, dtype=torch.bool, device=device)
        self.seed = torch.zeros(rows, dtype=torch.int64, device=device)
        self.out_pos = torch.zeros(rows, dtype=torch.int64, device=device)  # tokens drawn so far
        self.repetition = torch.ones(rows, device=device)
        self.frequency = torch.zeros(rows, device=device)
        self.presence = torch.zeros(rows, device=device)
        # allocated at the first request that uses a penalty: [rows, vocab] each
        self.counts: torch.Tensor | None = None  # output token counts
        self.seen: torch.Tensor | None = None  # prompt or output token present

    def assign(self, reqs: list[Req]) -> None:
        """Write the parameters of requests that just took their rows (new or resumed)."""
        if not reqs:
            return
        dev = self.device
        rows = to_device([r.row for r in reqs], torch.int64, dev)
        ps = [r.params for r in reqs]

        def put(dst: torch.Tensor, values: list, dtype: torch.dtype) -> None:
            dst.index_copy_(0, rows, to_device(values, dtype, dev))

        put(self.temperature, [p.temperature for p in ps], torch.float32)
        put(self.top_p, [p.top_p for p in ps], torch.float32)
        put(self.min_p, [p.min_p for p in ps], torch.float32)
        put(self.top_k, [p.top_k if 0 < p.top_k < self.vocab else self.vocab for p in ps], torch.int64)
        put(self.greedy, [p.greedy for p in ps], torch.bool)
        put(self.seed, [p.seed for p in ps], torch.int64)
        put(self.out_pos, [r.output_len for r in reqs], torch.int64)
        put(self.repetition, [p.repetition_penalty for p in ps], torch.float32)
        put(self.frequency, [p.frequency_penalty for p in ps], torch.float32)
        put(self.presence, [p.presence_penalty for p in ps], torch.float32)
        with_penalty = [r for r in reqs if uses_penalty(r)]
        if with_penalty:
            self._ensure_tables()
            for r in with_penalty:
                self._load_history(r)

    def _ensure_tables(self) -> None:
        if self.counts is None:
            n = self.temperature.shape[0]
            self.counts = torch.zeros(n, self.vocab, dtype=torch.int32, device=self.device)
            self.seen = torch.zeros(n, self.vocab, dtype=torch.bool, device=self.device)

    def _load_history(self, r: Req) -> None:
        assert self.counts is not None and self.seen is not None
        self.counts[r.row].zero_()
        self.seen[r.row].zero_()
        known = [t for t in r.tokens if 0 <= t < self.vocab]
        if known:
            self.seen[r.row, to_device(known, torch.int64, self.device)] = True
        outputs = [t for t in r.output_ids if 0 <= t < self.vocab]
        if outputs:
            ids = to_device(outputs, torch.int64, self.device)
            self.counts[r.row].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def record(self, rows: torch.Tensor, tokens: torch.Tensor, penalties: bool, advance: bool = True) -> None:
        """After a draw: advance the rows' output positions and, if in use, their counts.
        advance false (a step of greedy requests only): the positions stay, since only a
        sampling request's draw reads its own, and a request is greedy or not for its life."""
        if advance:
            self.out_pos.index_add_(0, rows, torch.ones_like(rows))
        if penalties and self.counts is not None and self.seen is not None:
            self.counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
            self.seen[rows, tokens] = True


def uses_penalty(r: Req) -> bool:
    p = r.params
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
