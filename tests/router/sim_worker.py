"""A simulated worker group for the router's policy tests: no torch, no Redis, no clock.

It takes AdmitReqs and AbortReqs, and each step follows the real scheduler's rules
(services/worker/scheduler.py): one decode token for every prefilled request, pausing
the newest requests when the pool cannot hold those tokens, prefill chunks within a
token budget (part-way prefills first, then new or paused requests in order, keeping
room for this step's decodes and the next, holding back one that would compute a prefix a
prompt being prefilled computes: prefill_sharing.py), a request finishing at EOS or at
max_new_tokens. It reports a WorkerStatus like the real worker's.

The "model" makes a request's next token a function of every token before it, through a
rolling hash kept per KV slot, the way attention reads the KV cache: a paused request
loses its slots, and only a recomputation over exactly the same tokens gives it the
same continuation. The pool (sim_pool.py, with an optional prompt cache) asserts its
invariant, never more tokens held than it has, at every allocation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.worker.prefill_sharing import MAX_HELD_BACK, Prefilling, block_hashes
from shared.messages import (
    ERR_DEADLINE,
    ERR_TOO_LARGE,
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    AbortReqs,
    AdmitReqs,
    GenerateReq,
    RunningReq,
    RunningTable,
    TokenItem,
    WorkerStatus,
)
from shared.prefix_tree import Node
from tests.router.sim_pool import SimPool

EOS = 0
_MASK = (1 << 64) - 1


def _mix(state: int, token: int) -> int:
    """SplitMix64 of (state, token): the 'K and V' of one position."""
    z = (state ^ (token * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(frozen=True)
class SimModel:
    eos_one_in: int = 64  # without ignore_eos, a token is EOS with probability 1/eos_one_in
    vocab: int = 50_000

    def kv(self, prev_state: int, token: int) -> int:
        return _mix(prev_state, token)

    def next_token(self, state: int, output_len: int, min_new_tokens: int) -> int:
        if output_len >= min_new_tokens and (state >> 8) % self.eos_one_in == 0:
            return EOS
        return 1 + state % (self.vocab - 1)

    def reference(self, req: GenerateReq) -> list[int]:
        """The output the request must have, run alone with nothing paused."""
        state, out = 0, []
        p = req.params
        tokens = list(req.input_ids)
        for tok in tokens:
            state = self.kv(state, tok)
        while True:
            tok = self.next_token(state, len(out), p.min_new_tokens)
            if p.ignore_eos and tok == EOS:
                tok = 1
            out.append(tok)
            if (tok == EOS and not p.ignore_eos) or len(out) >= p.max_new_tokens:
                return out
            state = self.kv(state, tok)


class SimReq:
    def __init__(self, msg: GenerateReq, admit_order: int) -> None:
        self.msg = msg
        self.rid = msg.rid
        self.params = msg.params
        self.admit_order = admit_order
        self.tokens = list(msg.input_ids)
        self.prompt_len = msg.prompt_len  # a request handed over comes with its output so far
        self.kv: list[int] = []  # one rolling state per token in the pool
        self.cached = 0  # of kv, the tokens in the prompt cache's tree (the first ones)
        self.node: Node | None = None  # the tree path it holds locked
        self.prompt_blocks: list[int] | None = None  # its prompt's block hashes (prefill_sharing.py)
        self.started = False
        self.finish_reason = ""
        self.error_kind = ""

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def pending(self) -> int:
        return len(self.tokens) - len(self.kv)

    @property
    def blocks(self) -> list[int]:
        if self.prompt_blocks is None:
            self.prompt_blocks = block_hashes(self.tokens[: self.prompt_len])
        return self.prompt_blocks

    @property
    def decoding(self) -> bool:
        return bool(self.kv) and self.pending == 1


class SimWorker:
    def __init__(
        self,
        group: str,
        capacity: int,
        model: SimModel,
        prefill_budget: int = 512,
        max_running: int = 256,
        incarnation: int = 0,
        prompt_cache: bool = False,
    ) -> None:
        self.group = group
        self.instance = f"sim-{group}-{incarnation}"
        self.capacity = capacity
        self.model = model
        self.prefill_budget = prefill_budget
        self.max_running = max_running
        self.pool = SimPool(capacity, prompt_cache)
        self.admit_seq = 0
        self.admitted = 0
        self.waiting: deque[SimReq] = deque()
        self.running: list[SimReq] = []
        self.inbox: list[AdmitReqs | AbortReqs] = []
        self.pauses = 0
        self.paused_rids: set[str] = set()
        self.changed = False
        self.frozen = False  # silent but alive: it neither steps nor reports
        self.rids_seen: set[str] = set()

    # ---------------------------------------------------------------- inbox

    def take_inbox(self, now_unix: float) -> list[TokenItem]:
        ended: list[SimReq] = []
        for msg in self.inbox:
            if isinstance(msg, AdmitReqs):
                assert msg.instance == self.instance, "admission addressed to another incarnation"
                assert msg.seq > self.admit_seq, "admission seqs must grow"
                for r in msg.reqs:
                    self.admitted += 1
                    self.rids_seen.add(r.rid)
                    self.waiting.append(SimReq(r, self.admitted))
                self.admit_seq = msg.seq
            else:
                for rid in msg.rids:
                    req = self._remove(rid)
                    if req is not None:
                        ended.append(self._finish(req, FINISH_ABORT))
        self.inbox = []
        for req in [r for r in [*self.running, *self.waiting] if r.msg.deadline and r.msg.deadline < now_unix]:
            self._remove(req.rid)
            ended.append(self._finish(req, FINISH_ERROR, ERR_DEADLINE))
        return [self._item(r, with_token=False) for r in ended]

    def _remove(self, rid: str) -> SimReq | None:
        for queue in (self.running, self.waiting):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    return req
        return None

    # ---------------------------------------------------------------- one step

    def step(self, now_unix: float) -> list[TokenItem]:
        items = self.take_inbox(now_unix)
        self.changed = bool(items)
        decodes = self._make_room([r for r in self.running if r.decoding], items)
        budget = self.prefill_budget - len(decodes)
        extends: list[tuple[SimReq, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            if not req.decoding and req.pending > 0:
                n = min(req.pending, budget)
                if self.pool.room < n + len(decodes):
                    break
                extends.append((req, n))
                self.pool.alloc(n)
                budget -= n
        self._start_waiting(budget, len(decodes), extends, items)
        self.pool.alloc(len(decodes))
        sampled: list[SimReq] = []
        for req, n in extends:
            self._compute(req, n)
            self.pool.cache(req)  # what its prefill has computed joins the prompt cache
            if req.pending == 0:
                sampled.append(req)
        for req in decodes:
            self._compute(req, 1)
            sampled.append(req)
        for req in sampled:
            tok = self.model.next_token(req.kv[-1], req.output_len, req.params.min_new_tokens)
            if req.params.ignore_eos and tok == EOS:
                tok = 1
            req.tokens.append(tok)
            self.changed |= req.output_len == 1
            reason = ""
            if tok == EOS and not req.params.ignore_eos:
                reason = FINISH_STOP
            elif req.output_len >= req.params.max_new_tokens:
                reason = FINISH_LENGTH
            if reason:
                self.running.remove(req)
                self.pool.cache(req)
                self._finish(req, reason)
            items.append(self._item(req, with_token=True))
        self.pool.check([*self.running, *self.waiting])
        return items

    def _start_waiting(
        self, budget: int, decodes: int, extends: list[tuple[SimReq, int]], items: list[TokenItem]
    ) -> None:
        """New or paused requests start, in order, while the budget and the pool allow (keeping
        room for this step's decodes and the next)."""
        caching = self.pool.tree is not None
        prefilling = Prefilling.of(self.running, caching)
        held_back, i = 0, 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_running:
            req = self.waiting[i]
            cached, unlocked = self.pool.peek(req)
            if prefilling and held_back < MAX_HELD_BACK and prefilling.worth_waiting(req.blocks, cached):
                held_back += 1
                i += 1
                continue
            pending = len(req.tokens) - cached
            n = min(pending, budget)
            if self.pool.room - unlocked < n + 2 * decodes + 1:
                if not self.running and self.pool.room - unlocked < pending:
                    del self.waiting[i]
                    items.append(self._item(self._finish(req, FINISH_ERROR, ERR_TOO_LARGE), with_token=False))
                    continue
                break
            del self.waiting[i]
            self.running.append(req)
            self.pool.start(req)
            extends.append((req, n))
            self.pool.alloc(n)
            budget -= n
            if caching:
                prefilling.add(req.blocks)

    def _make_room(self, decodes: list[SimReq], items: list[TokenItem]) -> list[SimReq]:
        """Pause the newest requests until this step's decode tokens fit (as the real scheduler)."""
        while decodes and self.pool.room < len(decodes):
            victim = max(self.running, key=lambda r: r.admit_order)
            self.running.remove(victim)
            if victim in decodes:
                decodes.remove(victim)
            if not self.running:
                items.append(self._item(self._finish(victim, FINISH_ERROR, ERR_TOO_LARGE), with_token=False))
                continue
            self._release(victim)
            self.waiting.appendleft(victim)
            self.pauses += 1
            self.paused_rids.add(victim.rid)
        return decodes

    def _compute(self, req: SimReq, n: int) -> None:
        state = req.kv[-1] if req.kv else 0
        for tok in req.tokens[len(req.kv) : len(req.kv) + n]:
            state = self.model.kv(state, tok)
            req.kv.append(state)

    def _release(self, req: SimReq) -> None:
        self.pool.release(req)

    def _finish(self, req: SimReq, reason: str, kind: str = "") -> SimReq:
        self._release(req)
        req.finish_reason = reason
        req.error_kind = kind
        self.changed = True
        return req

    def _item(self, req: SimReq, with_token: bool) -> TokenItem:
        return TokenItem(
            rid=req.rid,
            token_ids=[req.tokens[-1]] if with_token else [],
            finish_reason=req.finish_reason,
            error="simulated" if req.error_kind else "",
            error_kind=req.error_kind,
            prompt_tokens=req.prompt_len,
            output_tokens=req.output_len,
            handovers=req.msg.handovers,
        )

    # ---------------------------------------------------------------- state out

    @property
    def used(self) -> int:
        return self.pool.used

    @property
    def peak_used(self) -> int:
        return self.pool.peak_used

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def holds(self, rid: str) -> bool:
        return any(r.rid == rid for r in [*self.running, *self.waiting])

    def held_tokens(self, rid: str) -> int:
        """KV tokens the request occupies in the pool now."""
        return sum(len(r.kv) for r in [*self.running, *self.waiting] if r.rid == rid)

    def status(self, now_unix: float) -> WorkerStatus:
        in_waiting = {id(r) for r in self.waiting}
        running = [
            RunningReq(
                rid=r.rid,
                detok=r.msg.detok,
                prompt_tokens=r.prompt_len,
                held_tokens=len(r.tokens),
                remaining_tokens=max(0, r.params.max_new_tokens - r.output_len),
                paused=id(r) in in_waiting and r.output_len > 0,
                cached_tokens=r.cached,
            )
            for r in [*self.running, *self.waiting]
        ]
        return WorkerStatus(
            group=self.group,
            instance=self.instance,
            capacity_tokens=self.capacity,
            free_tokens=self.capacity - self.used,
            max_running=self.max_running,
            admit_seq=self.admit_seq,
            running=RunningTable.of(running),
            time=now_unix,
            evictable_tokens=self.pool.evictable,
            cache_locked_tokens=self.pool.locked,
            prompt_cache=self.pool.tree is not None,
        )
