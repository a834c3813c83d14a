"""Which requests run in the next step, and what happens to them after it.

Every step decodes one token for each prefilled request and spends what is left of the
prefill token budget on prefill chunks: first the requests already part-way through,
then new ones in arrival order. A long prompt is cut into chunks, so it never stalls
the running decodes. When the pool cannot hold this step's decode tokens, the newest
requests are paused: their KV is freed, their tokens kept, and they run again by
recomputation (a re-prefill) as soon as memory allows; their clients see a delay only.

Steps overlap: step N+1 is planned and launched before step N's tokens are known. At
launch (``launched``) each sampled request gets a placeholder token and its KV progress
moves on; a request that reaches its length stops being scheduled and gives its KV back
at once (the device runs steps in order, so no later step can touch those slots before
this one is done). When the tokens arrive (``resolve``) the placeholders are filled; a
request that produced an end token is finished then, and whatever a later step in flight
computes for it is discarded.

A request with a grammar (structured output, grammar.py) waits in ``compiling`` until its
grammar is compiled (in the compile thread), then joins the waiting queue; one whose grammar
does not compile fails there. Its tokens' checks are the engine's: ``resolve`` takes the end
the grammar says (``end``).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import torch

from services.worker import prompt_logprobs
from services.worker.memory.kv_manager import KVManager
from services.worker.prefill_sharing import MAX_HELD_BACK, Prefilling
from services.worker.request import PLACEHOLDER, Req
from shared.messages import (
    ERR_DEADLINE,
    ERR_INVALID,
    ERR_TOO_LARGE,
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
)

log = logging.getLogger(__name__)


@dataclass
class StepPlan:
    extends: list[tuple[Req, int]] = field(default_factory=list)  # (request, new tokens this step)
    decodes: list[Req] = field(default_factory=list)
    extend_slots: list[torch.Tensor] = field(default_factory=list)
    decode_slots: torch.Tensor | None = None
    new_rows: list[Req] = field(default_factory=list)  # requests that took a row in this plan
    prompt_rows: int = 0  # prompt-logprob rows the extends compute (prompt_logprobs.py)

    @property
    def empty(self) -> bool:
        return not self.extends and not self.decodes

    def sampled(self) -> list[Req]:
        """Requests that get a token from this step, in sample order."""
        done = [r for r, n in self.extends if r.kv_len + n == len(r.tokens)]
        return done + self.decodes


@dataclass(frozen=True)
class SchedulerLimits:
    max_running: int
    prefill_budget: int  # tokens per step
    max_total_len: int  # prompt + output, per request


class Scheduler:
    def __init__(self, kv: KVManager, limits: SchedulerLimits, eos_ids: frozenset[int]) -> None:
        self.kv = kv
        self.limits = limits
        self.eos_ids = eos_ids
        self.waiting: deque[Req] = deque()  # admitted (or paused) and holding no KV
        self.compiling: list[Req] = []  # admitted, waiting for their grammar to be compiled
        self.running: list[Req] = []  # holding KV, in admission order
        self.finished: list[Req] = []  # ended since the last take_finished()
        self.constrained = 0  # requests held with a grammar: without any, a step makes no mask
        self.num_paused_total = 0
        self.num_held_back_total = 0  # steps a waiting request waited for a prefix being prefilled

    # ---------------------------------------------------------------- membership

    def add(self, req: Req) -> None:
        (self.waiting if req.grammar is None else self.compiling).append(req)
        self.constrained += req.grammar is not None

    def has_work(self) -> bool:
        """Requests to run; a request whose grammar is still compiling is not one yet."""
        return bool(self.waiting or self.running) or any(r.grammar.ready for r in self.compiling if r.grammar)

    def num_held(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.compiling)

    def all_requests(self) -> list[Req]:
        return [*self.running, *self.waiting, *self.compiling]

    def abort(self, rid: str, reason: str = FINISH_ABORT) -> Req | None:
        """End a running or waiting request now; its tokens still in flight are discarded."""
        for queue in (self.running, self.waiting, self.compiling):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    self._finish(req, reason)
                    return req
        return None

    def expire(self, now: float) -> list[Req]:
        """End the requests whose deadline has passed."""
        late = [r for r in self.all_requests() if r.deadline and r.deadline < now]
        for req in late:
            req.error = "deadline exceeded"
            req.error_kind = ERR_DEADLINE
            self.abort(req.rid, FINISH_ERROR)
        return late

    def take_finished(self) -> list[Req]:
        out, self.finished = self.finished, []
        return out

    # ---------------------------------------------------------------- planning

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if self.compiling:
            self._take_compiled()
        decodes = [r for r in self.running if r.decoding]
        decodes = self._make_room_for(decodes)
        budget = self.limits.prefill_budget - len(decodes)
        # requests part-way through their prefill hold KV already: finish them first
        for req in self.running:
            if budget <= 0:
                break
            if not req.decoding and req.pending > 0:
                n = prompt_logprobs.capped(req, min(req.pending, budget), prompt_logprobs.MAX_ROWS - plan.prompt_rows)
                if n == 0:
                    continue
                if not self.kv.can_allocate(n + len(decodes)):
                    break
                self._plan_extend(plan, req, n)
                budget -= n
        self._start_waiting(plan, len(decodes), budget)
        plan.decodes = decodes
        if decodes:
            plan.decode_slots = self.kv.allocate_one_each(decodes)
        return plan

    def _start_waiting(self, plan: StepPlan, decodes: int, budget: int) -> None:
        """Waiting requests start in arrival order while the budget and the pool allow, keeping
        room for this step's decodes and the next. One that would compute a prompt prefix that a
        request being prefilled computes too waits for it (prefill_sharing.py); later ones go on."""
        prefilling = Prefilling.of(self.running, self.kv.caching)
        held_back, i = 0, 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.limits.max_running:
            req = self.waiting[i]
            if req.unresolved:  # paused while a token of it was in flight: wait for the token
                break
            # its cached prefix, if any, is reused rather than recomputed; not by one that owes prompt
            # logprobs, which computes every prompt position (nor does it wait for a prefix)
            owes = prompt_logprobs.wants(req)
            hit = None if owes else self.kv.lookup(req)
            cached, pinned = (hit.length, hit.unlocked) if hit is not None else (0, 0)
            if not owes and prefilling and held_back < MAX_HELD_BACK and prefilling.worth_waiting(req.blocks, cached):
                held_back += 1
                self.num_held_back_total += 1
                i += 1
                continue
            n = prompt_logprobs.capped(
                req, min(len(req.tokens) - cached, budget), prompt_logprobs.MAX_ROWS - plan.prompt_rows
            )
            if n == 0:
                break
            # keep room for this step's decodes and the next step's
            if not self.kv.can_allocate(n + 2 * decodes + 1, new_rows=1, pinned=pinned):
                alone = len(req.tokens) - cached
                if not self.running and not self.kv.can_allocate(alone, new_rows=1, pinned=pinned):
                    del self.waiting[i]
                    self._fail(req, "the request needs more KV tokens than the pool has")
                    continue
                break
            del self.waiting[i]
            self.running.append(req)
            self.kv.start(req, hit)
            plan.new_rows.append(req)
            self._plan_extend(plan, req, n)
            budget -= n
            if self.kv.caching:
                prefilling.add(req.blocks)

    def _take_compiled(self) -> None:
        """Requests whose grammar is compiled join the waiting queue (in arrival order); those
        whose grammar could not be compiled fail."""
        still = []
        for req in self.compiling:
            g = req.grammar
            assert g is not None
            if not g.ready:
                still.append(req)
            elif why := g.error():
                self._fail(req, why, ERR_INVALID)
            else:
                g.start(req.output_ids)
                self.waiting.append(req)
        self.compiling = still

    def _plan_extend(self, plan: StepPlan, req: Req, n: int) -> None:
        plan.extends.append((req, n))
        plan.prompt_rows += len(prompt_logprobs.rows_in(req, req.kv_len, n))
        plan.extend_slots.append(self.kv.allocate(req, n))

    def _make_room_for(self, decodes: list[Req]) -> list[Req]:
        """Pause the newest requests until this step's decode tokens fit."""
        while decodes and not self.kv.can_allocate(len(decodes)):
            victim = max(self.running, key=lambda r: r.admit_order)
            if len(self.running) == 1:
                self.running.remove(victim)
                decodes.remove(victim)
                self._fail(victim, "the KV pool cannot hold this request alone")
                continue
            self.running.remove(victim)
            if victim in decodes:
                decodes.remove(victim)
            self.kv.release(victim)
            self.waiting.appendleft(victim)
            self.num_paused_total += 1
            log.info("paused (KV pool full); resumes by recomputation", extra={"rid": victim.rid})
        return decodes

    # ---------------------------------------------------------------- after launch, after the step

    def launched(self, plan: StepPlan, sampled: list[Req]) -> list[int]:
        """The step is on its way: advance KV progress, give each sampled request a placeholder
        token; -> each placeholder's index in its request's tokens."""
        for req, n in plan.extends:
            prompt_logprobs.launched(req, req.kv_len, n)
            req.kv_len += n
            self.kv.cache_progress(req)
        for req in plan.decodes:
            req.kv_len += 1
        positions = []
        for req in sampled:
            positions.append(len(req.tokens))
            req.tokens.append(PLACEHOLDER)
            req.unresolved += 1
            if req.output_len >= req.params.max_new_tokens or len(req.tokens) >= self.limits.max_total_len:
                # its last token is in flight: schedule it no more, free its KV now
                self.running.remove(req)
                self.kv.release(req)
                req.closing = True
        return positions

    def resolve(self, req: Req, pos: int, tok: int, end: str = "") -> bool:
        """A token from a finished step; -> False when it is discarded (the request ended already).
        end: a finish reason decided by the caller (the request's grammar ended it)."""
        if req.finish_reason:
            return False
        req.tokens[pos] = tok
        req.unresolved -= 1
        reason = ""
        p = req.params
        produced = pos - req.prompt_len + 1
        if end:
            reason = end
        elif produced >= p.min_new_tokens and ((not p.ignore_eos and tok in self.eos_ids) or tok in p.stop_token_ids):
            reason = FINISH_STOP
        elif req.closing and req.unresolved == 0:
            reason = FINISH_LENGTH
        if reason:
            del req.tokens[pos + 1 :]  # placeholders of steps launched after this one
            req.unresolved = 0
            if not req.closing:
                for queue in (self.running, self.waiting):
                    if req in queue:
                        queue.remove(req)
            self._ended(req, reason)
        return True

    def _finish(self, req: Req, reason: str) -> None:
        """End a request that has no token in flight to report its end with."""
        self._ended(req, reason)
        self.finished.append(req)

    def _ended(self, req: Req, reason: str) -> None:
        req.finish_reason = reason
        self.kv.release(req)
        self.constrained -= req.grammar is not None

    def _fail(self, req: Req, why: str, kind: str = ERR_TOO_LARGE) -> None:
        # the request cannot be served as asked (too long for the pool, a format that does not
        # compile): its client gets a 4xx that says why; nothing is wrong with the worker
        log.warning("failing request: %s", why, extra={"rid": req.rid})
        req.error = why
        req.error_kind = kind
        self._finish(req, FINISH_ERROR)
