"""The router's policy as a state machine: messages and clock ticks in, actions out.

No I/O here, so tests drive it against a simulated worker with a fake clock. The
service (service.py) feeds it what arrives on the router's stream and carries out the
actions it returns.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from services.router.group import GroupState
from shared.config import RouterConfig
from shared.messages import (
    ERR_DEADLINE,
    ERR_FAILED,
    ERR_OVERLOADED,
    ERR_TOO_LARGE,
    FINISH_ABORT,
    FINISH_ERROR,
    GenerateReq,
    TokenItem,
    WorkerStatus,
)

log = logging.getLogger(__name__)


@dataclass
class Actions:
    admits: dict[tuple[str, str], list[GenerateReq]] = field(default_factory=dict)  # (group, instance) -> reqs
    admit_seqs: dict[tuple[str, str], int] = field(default_factory=dict)
    aborts: dict[str, list[str]] = field(default_factory=dict)  # group -> rids
    ended: dict[str, list[TokenItem]] = field(default_factory=dict)  # detok shard -> final items
    released: list[str] = field(default_factory=list)  # rids that left the waiting queue

    def end(self, detok: str, rid: str, prompt_tokens: int, reason: str, error: str = "", kind: str = "") -> None:
        item = TokenItem(
            rid=rid, token_ids=[], finish_reason=reason, error=error, error_kind=kind, prompt_tokens=prompt_tokens
        )
        self.ended.setdefault(detok, []).append(item)

    @property
    def empty(self) -> bool:
        return not (self.admits or self.aborts or self.ended or self.released)


@dataclass
class RouterStats:
    admitted: int = 0
    rejected: int = 0
    requeued: int = 0
    failed: int = 0
    aborted: int = 0


class RouterCore:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.waiting: deque[GenerateReq] = deque()
        self.groups: dict[str, GroupState] = {}
        self.where: dict[str, str] = {}  # rid -> group it is placed on
        self.stats = RouterStats()

    # ---------------------------------------------------------------- inputs

    def on_generate(self, req: GenerateReq, now_unix: float, act: Actions) -> None:
        if req.rid in self.where or any(w.rid == req.rid for w in self.waiting):
            act.released.append(req.rid)  # a duplicate delivery: the first copy is in hand
            return
        if len(self.waiting) >= self.cfg.max_waiting:
            self._reject(req, f"overloaded: {len(self.waiting)} requests are waiting", act, ERR_OVERLOADED)
            return
        if req.deadline and req.deadline < now_unix:
            self._reject(req, "deadline exceeded before the request was queued", act, ERR_DEADLINE)
            return
        self.waiting.append(req)

    def on_abort(self, rid: str, act: Actions) -> None:
        group = self.where.get(rid)
        if group is not None:
            act.aborts.setdefault(group, []).append(rid)
            self.stats.aborted += 1
            return
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                act.end(req.detok, rid, len(req.input_ids), FINISH_ABORT)
                act.released.append(rid)
                self.stats.aborted += 1
                return

    def on_status(self, st: WorkerStatus, now: float, act: Actions) -> None:
        g = self.groups.get(st.group)
        if g is not None and g.instance != st.instance:
            log.warning("worker group %s restarted (instance %s -> %s)", st.group, g.instance, st.instance)
            self._lose_group(g, "its worker restarted", act)
            g = None
        if g is None:
            g = GroupState.from_status(st, now)
            self.groups[st.group] = g
            for rid in g.placed:
                self.where[rid] = g.name
            log.info("worker group %s joined: %d KV tokens, %d requests held", g.name, g.capacity, len(g.placed))
            return
        for rid in g.apply(st, now):
            self.where.pop(rid, None)

    # ---------------------------------------------------------------- the clock

    def tick(self, now: float, now_unix: float, act: Actions) -> None:
        for g in list(self.groups.values()):
            if now - g.last_seen > self.cfg.worker_dead_after_s:
                log.error("worker group %s sent no status for %.1fs: declared dead", g.name, now - g.last_seen)
                self._lose_group(g, f"worker group {g.name} died", act)
        self._expire_waiting(now_unix, act)
        self._admit(act)

    # ---------------------------------------------------------------- policy

    def _admit(self, act: Actions) -> None:
        guess = self.cfg.router_max_new_token_len
        while self.waiting and self.groups:
            req = self.waiting[0]
            best: GroupState | None = None
            best_room = -1
            for g in self.groups.values():
                busy = g.used_fraction >= self.cfg.router_token_ratio
                if len(g.placed) >= self.cfg.running_max_req_size:
                    continue
                budget = self.cfg.batch_max_tokens
                if budget and g.placed and g.backlog_tokens() + len(req.input_ids) > budget:
                    continue
                room = g.capacity - g.peak_with(req, busy, guess)
                if room >= 0 and room > best_room:
                    best, best_room = g, room
            if best is None:
                biggest = max(g.capacity for g in self.groups.values())
                alone = len(req.input_ids) + req.params.max_new_tokens
                if alone > biggest:  # it could block the head of the queue for ever
                    self.waiting.popleft()
                    why = f"prompt plus max_new_tokens is {alone} KV tokens; the largest worker pool holds {biggest}"
                    self._reject(req, why, act, ERR_TOO_LARGE)
                    continue
                return  # the head waits for memory; keeping order keeps it fair
            self.waiting.popleft()
            key = (best.name, best.instance)
            best.place(req)
            self.where[req.rid] = best.name
            act.admits.setdefault(key, []).append(req)
            act.admit_seqs[key] = best.next_seq
            act.released.append(req.rid)
            self.stats.admitted += 1

    def seal_admissions(self, act: Actions) -> None:
        """The admissions of this round are sent as one AdmitReqs per group: move the seqs on."""
        for (name, _instance), _ in act.admits.items():
            self.groups[name].next_seq += 1

    def _lose_group(self, g: GroupState, why: str, act: Actions) -> None:
        """A group died: requests with no output yet go back to the queue; the rest end with an error."""
        del self.groups[g.name]
        requeue = []
        for rid, p in g.placed.items():
            self.where.pop(rid, None)
            if p.req is not None and p.output_tokens == 0:
                requeue.append(p.req)
            else:
                act.end(p.detok, rid, p.prompt_tokens, FINISH_ERROR, f"{why} while the request was running", ERR_FAILED)
                self.stats.failed += 1
        for req in sorted(requeue, key=lambda r: r.arrival, reverse=True):
            self.waiting.appendleft(req)
        self.stats.requeued += len(requeue)
        if requeue:
            log.warning("re-queued %d requests of group %s that had produced no output", len(requeue), g.name)

    def _expire_waiting(self, now_unix: float, act: Actions) -> None:
        late = [r for r in self.waiting if r.deadline and r.deadline < now_unix]
        for req in late:
            self.waiting.remove(req)
            self._reject(req, "deadline exceeded while queued", act, ERR_DEADLINE)

    def _reject(self, req: GenerateReq, why: str, act: Actions, kind: str) -> None:
        log.warning("rejected: %s", why, extra={"rid": req.rid})
        act.end(req.detok, req.rid, len(req.input_ids), FINISH_ERROR, why, kind)
        act.released.append(req.rid)
        self.stats.rejected += 1

    # ---------------------------------------------------------------- figures

    def figures(self) -> dict[str, float]:
        out: dict[str, float] = {
            "waiting": len(self.waiting),
            "running": sum(len(g.placed) for g in self.groups.values()),
            "groups": len(self.groups),
            "admitted_total": self.stats.admitted,
            "rejected_total": self.stats.rejected,
        }
        for g in self.groups.values():
            out[f"group_{g.name}_used_fraction"] = round(g.used_fraction, 4)
        return out
