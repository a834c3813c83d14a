"""The router's policy (RouterCore) against simulated worker groups on a fake clock.

Each round is one worker step of step_s fake seconds: requests and aborts that are due
reach the router, then the statuses the workers sent in the previous round; the router
ticks; its admissions and aborts reach the workers' inboxes; every live worker runs one
step. A worker sends a status like the real one: every status_every_s, and in the round
after a step that ended a request or produced a first token.

It also plays the router service's delivery guarantees: a GenerateReq stays pending until
the router releases it (admits or ends it), and a restarted router is handed the pending
ones again after claim_delay_s, as a successor claims a dead consumer's entries. Token items
are checked as the detokenizer does: a request whose output count jumps or repeats is ended
with an error. It plays the detokenizer's part in a hand-over too: a request the router hands
over comes back in the next round with the tokens received so far, and items of the copy
that ran before are dropped.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field, replace

from services.router.actions import Actions
from services.router.core import RouterCore
from shared.config import RouterConfig
from shared.messages import (
    ERR_FAILED,
    FINISH_ERROR,
    AbortReqs,
    AdmitReqs,
    GenerateReq,
    SamplingParams,
    TokenItem,
    WorkerStatus,
)
from tests.router.sim_worker import SimModel, SimWorker

T0_UNIX = 1_000_000.0


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""
    error_kind: str = ""
    ended_at: float = 0.0


def make_req(
    rid: str,
    prompt_len: int,
    max_new: int,
    ignore_eos: bool,
    arrival_s: float = 0.0,
    deadline_s: float = 0.0,
) -> GenerateReq:
    """A request whose prompt tokens are drawn from its id, so every run sees the same ones."""
    rng = random.Random(rid)
    prompt = [rng.randint(1, 49_999) for _ in range(prompt_len)]
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    deadline = T0_UNIX + deadline_s if deadline_s else 0.0
    return GenerateReq(rid, "front", "detok", prompt, params, T0_UNIX + arrival_s, deadline)


class Simulation:
    def __init__(
        self,
        cfg: RouterConfig,
        workers: list[SimWorker],
        step_s: float = 0.02,
        status_every_s: float = 0.5,
        claim_delay_s: float = 6.0,
        tick_each_status: bool = False,
    ) -> None:
        self.cfg = cfg
        # the router service ticks after each status it reads, and groups' statuses arrive apart:
        # each admission round then sees one group's fresh room (False: one tick after all of them)
        self.tick_each_status = tick_each_status
        self.core = RouterCore(cfg)
        self.workers = {w.group: w for w in workers}
        self.dead: set[str] = set()
        self.step_s = step_s
        self.status_every_s = status_every_s
        self.claim_delay_s = claim_delay_s
        self.t = 0.0
        self._arrivals: list[tuple[float, int, GenerateReq]] = []
        self._aborts: list[tuple[float, int, str]] = []
        self._seq = 0
        self._statuses: list[WorkerStatus] = []  # sent in the last round, read in this one
        self._last_status: dict[str, float] = {}
        self._redeliver_at: float | None = None
        self.pending: dict[str, GenerateReq] = {}  # unacknowledged GenerateReqs
        self.reqs: dict[str, GenerateReq] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.handovers: dict[str, int] = {}  # rid -> its hand-overs so far, as its detokenizer counts them
        self.samples: list[tuple[float, bool, int, int]] = []  # per round: (time, requests waiting, held, capacity)

    @property
    def now_unix(self) -> float:
        return T0_UNIX + self.t

    @property
    def model(self) -> SimModel:
        return next(iter(self.workers.values())).model

    # ---------------------------------------------------------------- scripting

    def submit(self, req: GenerateReq) -> None:
        self.reqs[req.rid] = req
        self.outcomes[req.rid] = Outcome()
        self._seq += 1
        heapq.heappush(self._arrivals, (req.arrival - T0_UNIX, self._seq, req))

    def abort_at(self, t: float, rid: str) -> None:
        self._seq += 1
        heapq.heappush(self._aborts, (t, self._seq, rid))

    def kill(self, group: str) -> None:
        """The group stops stepping and reporting; what it held is lost with it."""
        self.dead.add(group)

    def restart(self, group: str) -> SimWorker:
        old = self.workers[group]
        incarnation = int(old.instance.rsplit("-", 1)[1]) + 1
        cache = old.pool.tree is not None
        w = SimWorker(group, old.capacity, old.model, old.prefill_budget, old.max_running, incarnation, cache)
        self.workers[group] = w
        self.dead.discard(group)
        self._last_status.pop(group, None)
        return w

    def restart_router(self) -> None:
        """A new router with an empty state: it learns the groups from their statuses and is
        handed the requests still pending after claim_delay_s."""
        self.core = RouterCore(self.cfg)
        self._redeliver_at = self.t + self.claim_delay_s

    def run_until(self, t_end: float) -> None:
        while self.t < t_end - 1e-9:
            self.round()

    def run_until_done(self, max_s: float = 600.0) -> None:
        while not all(o.finish_reason for o in self.outcomes.values()):
            assert self.t < max_s, f"requests still open after {max_s}s of simulated time"
            self.round()

    # ---------------------------------------------------------------- one round

    def round(self) -> None:
        self.t = round(self.t + self.step_s, 9)
        act = Actions()
        while self._arrivals and self._arrivals[0][0] <= self.t + 1e-9:
            req = heapq.heappop(self._arrivals)[2]
            self.pending[req.rid] = req
            self.core.on_generate(req, self.now_unix, act)
        if self._redeliver_at is not None and self.t >= self._redeliver_at:
            self._redeliver_at = None
            for req in list(self.pending.values()):
                self.core.on_generate(req, self.now_unix, act)
        while self._aborts and self._aborts[0][0] <= self.t + 1e-9:
            self.core.on_abort(heapq.heappop(self._aborts)[2], self.t, act)
        for st in self._statuses:
            self.core.on_status(st, self.t, act)
            if self.tick_each_status:
                self.core.tick(self.t, self.now_unix, act)
        self._statuses = []
        self.core.tick(self.t, self.now_unix, act)
        self._carry_out(act)
        for name, w in self.workers.items():
            if name in self.dead or w.frozen:
                continue
            self._receive(w.step(self.now_unix))
            last = self._last_status.get(name)
            if last is None or self.t - last >= self.status_every_s or w.changed:
                self._statuses.append(w.status(self.now_unix))
                self._last_status[name] = self.t
        live = [w for n, w in self.workers.items() if n not in self.dead]
        self.samples.append((self.t, bool(self.core.waiting), sum(w.used for w in live), sum(w.capacity for w in live)))

    def _carry_out(self, act: Actions) -> None:
        for (group, instance), reqs in act.admits.items():
            self.workers[group].inbox.append(AdmitReqs(instance, act.admit_seqs[(group, instance)], reqs))
        for group, rids in act.aborts.items():
            self.workers[group].inbox.append(AbortReqs(rids, "aborted"))
        for items in act.ended.values():
            self._receive(items, from_worker=False)
        for rid in act.released:
            self.pending.pop(rid, None)
        for req, _why in act.handovers:
            self._hand_over(req)
        self.core.seal_admissions(act)

    def _hand_over(self, req: GenerateReq) -> None:
        """As the detokenizer: the request back to the router with the tokens its client has."""
        out = self.outcomes[req.rid]
        if out.finish_reason:
            return  # its end came before the group died
        self.handovers[req.rid] = req.handovers + 1
        prompt = list(req.input_ids[: req.prompt_len])
        back = replace(req, input_ids=prompt + out.tokens, resumed=len(out.tokens), handovers=req.handovers + 1)
        self._seq += 1
        heapq.heappush(self._arrivals, (self.t, self._seq, back))

    def _receive(self, items: list[TokenItem], from_worker: bool = True) -> None:
        for item in items:
            out = self.outcomes[item.rid]
            if out.finish_reason:
                continue  # ended already: the detokenizer has closed its session
            if from_worker and item.handovers < self.handovers.get(item.rid, 0):
                continue  # a copy that ran before its last hand-over
            if item.token_ids and item.output_tokens != len(out.tokens) + len(item.token_ids):
                out.finish_reason, out.error_kind, out.ended_at = FINISH_ERROR, ERR_FAILED, self.t
                continue
            out.tokens.extend(item.token_ids)
            if item.finish_reason:
                out.finish_reason, out.error_kind, out.ended_at = item.finish_reason, item.error_kind, self.t

    # ---------------------------------------------------------------- figures

    def usage_under_load(self, start_s: float = 0.0, end_s: float = float("inf")) -> tuple[float, float]:
        """(mean, 10th percentile) of the fraction of the KV pools held, over the rounds
        between start_s and end_s in which requests waited in the router's queue."""
        loaded = sorted(u / c for t, waiting, u, c in self.samples if waiting and c and start_s <= t <= end_s)
        assert loaded, "the router's queue was never non-empty: no load"
        return sum(loaded) / len(loaded), loaded[len(loaded) // 10]

    def pauses(self) -> int:
        return sum(w.pauses for w in self.workers.values())

    def paused_rids(self) -> set[str]:
        return set().union(*(w.paused_rids for w in self.workers.values()))


def mixed_workload(n: int, seed: int, rate_per_s: float = 0.0) -> list[GenerateReq]:
    """ShareGPT-shaped requests (prompts and output limits drawn log-normally, means near
    225 and 196 like ../shared/bench/workload.py), half with ignore_eos; the others end
    at EOS, usually well before max_new_tokens. rate_per_s 0: all arrive at once."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        prompt = min(max(int(rng.lognormvariate(5.1, 0.7)), 4), 1024)
        max_new = min(max(int(rng.lognormvariate(5.0, 0.7)), 4), 1024)
        if rate_per_s:
            t += rng.expovariate(rate_per_s)
        out.append(make_req(f"r{seed}-{i}", prompt, max_new, rng.random() < 0.5, arrival_s=t))
    return out


def shared_prefix_workload(
    prefixes: int,
    per_prefix: int,
    seed: int,
    prefix_len: int = 200,
    suffix_len: int = 40,
    max_new: int = 32,
    rate_per_s: float = 0.0,
) -> list[GenerateReq]:
    """per_prefix requests for each of ``prefixes`` random prefixes (a system prompt, a document),
    each prefix followed by a suffix of its own, shuffled; ignore_eos, so their lengths are known.
    rate_per_s 0: all arrive at once."""
    rng = random.Random(seed)
    heads = [[rng.randint(1, 49_999) for _ in range(prefix_len)] for _ in range(prefixes)]
    order = [p for p in range(prefixes) for _ in range(per_prefix)]
    rng.shuffle(order)
    out, t = [], 0.0
    for i, p in enumerate(order):
        if rate_per_s:
            t += rng.expovariate(rate_per_s)
        prompt = heads[p] + [rng.randint(1, 49_999) for _ in range(suffix_len)]
        params = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
        out.append(GenerateReq(f"s{seed}-{p}-{i}", "front", "detok", prompt, params, T0_UNIX + t, 0.0))
    return out
