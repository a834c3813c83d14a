"""The router's policy as a state machine: messages and clock ticks in, actions out.

No I/O here, so tests drive it against a simulated worker with a fake clock. The
service (service.py) feeds it what arrives on the router's stream and carries out the
actions it returns.
"""

from __future__ import annotations

import logging
from itertools import islice

from services.router.actions import Actions, RouterStats
from services.router.group import GroupState
from services.router.metrics import RouterFigures
from services.router.routing import LaneRound, Routing
from services.router.waiting import RecentAborts, WaitingQueue
from shared.config import RouterConfig
from shared.messages import (
    ERR_DEADLINE,
    ERR_FAILED,
    ERR_OVERLOADED,
    ERR_TOO_LARGE,
    FINISH_ABORT,
    FINISH_ERROR,
    AdmitReqs,
    GenerateReq,
    WorkerStatus,
)

log = logging.getLogger(__name__)

EXPIRY_SCAN_EVERY_S = 0.1  # the queue is scanned for missed deadlines at most this often
# a request handed over more often than this has probably killed its groups: it ends instead
MAX_HANDOVERS = 3
LANE_SCAN = 512  # cache_aware: requests looked at in one admission round, at most


class RouterCore:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.waiting = WaitingQueue()
        self.groups: dict[str, GroupState] = {}
        self.where: dict[str, str] = {}  # rid -> the group it runs on
        self.fenced: dict[str, str] = {}  # group -> the instance declared dead (it may only have been silent)
        # (group, rid): requests learnt from a status (placed by a predecessor) whose copies have not
        # been looked for (shared/request_copies.py)
        self.uncopied: set[tuple[str, str]] = set()
        self.recent_aborts = RecentAborts()
        self.stats = RouterStats()
        self.routing = Routing(cfg)
        self._no_group_since: float | None = None
        self._dirty = True  # something admission depends on changed since it last ran
        self._next_expiry_scan = 0.0

    # ---------------------------------------------------------------- inputs

    def on_generate(self, req: GenerateReq, now_unix: float, act: Actions) -> None:
        if req.handovers:
            self._older_copy_gone(req, act)
        if req.rid in self.where or req.rid in self.waiting:
            act.released.append(req.rid)  # a second delivery: the first copy is in hand
            return
        if req.rid in self.recent_aborts:
            self.recent_aborts.discard(req.rid)
            act.end(req.detok, req.rid, req.prompt_len, FINISH_ABORT)
            act.released.append(req.rid)
            self.stats.aborted += 1
            return
        if req.handovers:
            self._go_on(req, now_unix, act)
            return
        if len(self.waiting) >= self.cfg.max_waiting:
            self._reject(req, f"overloaded: {len(self.waiting)} requests are waiting", act, ERR_OVERLOADED)
            return
        if req.deadline and req.deadline < now_unix:
            self._reject(req, "deadline exceeded before the request was queued", act, ERR_DEADLINE)
            return
        self.waiting.append(req)
        self._dirty = True

    def _older_copy_gone(self, req: GenerateReq, act: Actions) -> None:
        """A handed-over request whose older copy a group still holds (declared dead, it was only
        silent, and a router that restarted since took it back): that copy is stopped, its items
        are stale to the detokenizer already."""
        group = self.where.get(req.rid)
        placed = self.groups[group].placed.get(req.rid) if group in self.groups else None
        if group is None or placed is None:
            return
        older = placed.req
        if older is None or older.handovers < req.handovers:
            del self.where[req.rid]
            act.abort(group, req.rid)

    def _go_on(self, req: GenerateReq, now_unix: float, act: Actions) -> None:
        """A request handed over from a dead group, back from its detokenizer shard with its
        output so far: it takes its place in line again (no queue bound: it was admitted once)."""
        if req.handovers > MAX_HANDOVERS:
            why = f"its worker group died {req.handovers} times while it ran"
            self._reject(req, why, act, ERR_FAILED)
        elif req.deadline and req.deadline < now_unix:
            self._reject(req, "deadline exceeded while it was handed over", act, ERR_DEADLINE)
        else:
            self.waiting.insert_by_arrival(req)
            self._dirty = True
            log.info("handed over with %d tokens of output: queued again", req.resumed, extra={"rid": req.rid})

    def on_abort(self, rid: str, now: float, act: Actions) -> None:
        """Stop a request wherever it is: in the queue here, or on its worker group."""
        group = self.where.get(rid)
        if group is not None:
            act.abort(group, rid)  # the group frees its KV and ends it; its next status drops it
            self.groups[group].placed[rid].aborted = True  # should the group die first, not handed over
            self.stats.aborted += 1
            return
        req = self.waiting.remove(rid)
        if req is not None:
            act.end(req.detok, rid, req.prompt_len, FINISH_ABORT)
            act.released.append(rid)
            self.stats.aborted += 1
            self._dirty = True
        # remembered either way: a second copy may still arrive (a request being handed over, on
        # its way back from its detokenizer shard), or the request itself (a claimed entry, or a
        # status after a restart)
        self.recent_aborts.add(rid, now)

    def first_heard(self, st: WorkerStatus) -> bool:
        """A status from a group this router has never heard of (it restarted since, or the group
        is new): the copies of what routers before it placed there are wanted (on_status's placed)."""
        return st.group not in self.groups and st.group not in self.fenced

    def on_status(self, st: WorkerStatus, now: float, act: Actions, placed: dict[str, AdmitReqs] | None = None) -> None:
        self._dirty = True
        g = self.groups.get(st.group)
        if g is not None and g.instance != st.instance:
            log.warning("worker group %s restarted (instance %s -> %s)", st.group, g.instance, st.instance)
            self._lose_group(g, "its worker restarted", act)
            g = None
        if g is None:
            g = self._join(st, now, act, placed or {})
        else:
            gone, learnt = g.apply(st, now)
            act.forgotten += [(g.name, rid) for rid in gone]
            for rid in gone:
                if self.where.get(rid) == g.name:
                    del self.where[rid]
            self._adopt(g, learnt, act, fenced=False)
        for rid in st.running.rids:
            if rid in self.recent_aborts:
                self.recent_aborts.discard(rid)
                act.abort(g.name, rid)
                self.stats.aborted += 1
        if st.leaving:  # a drain that ended: what it still lists goes on elsewhere
            log.warning("worker group %s left with %d requests held", g.name, len(st.running))
            self._lose_group(g, f"worker group {g.name} shut down", act)
            self.fenced[g.name] = g.instance  # should it send again, what it holds is stopped there

    # ---------------------------------------------------------------- the clock

    def excuse_silence(self, until: float) -> None:
        """Redis was away until ``until``: no group could send a status, so none is silent
        before then (a Redis restart or failover is no group's death)."""
        for g in self.groups.values():
            g.last_seen = max(g.last_seen, until)
        if self._no_group_since is not None:
            self._no_group_since = max(self._no_group_since, until)

    def tick(self, now: float, now_unix: float, act: Actions) -> None:
        for g in list(self.groups.values()):
            if now - g.last_seen > self.cfg.worker_dead_after_s:
                log.error("worker group %s sent no status for %.1fs: declared dead", g.name, now - g.last_seen)
                self._lose_group(g, f"worker group {g.name} died", act)
                self.fenced[g.name] = g.instance
        self.recent_aborts.prune(now)
        if now >= self._next_expiry_scan:
            self._next_expiry_scan = now + EXPIRY_SCAN_EVERY_S
            self._expire_waiting(now_unix, act)
        self._fail_without_groups(now, act)
        if self._dirty:
            self._dirty = False
            self._admit(now_unix, act)

    # ---------------------------------------------------------------- policy

    def _admit(self, now_unix: float, act: Actions) -> None:
        if self.routing.by_lane:
            self._admit_by_lane(now_unix, act)
            return
        while self.waiting and self.groups:
            req = self.waiting.head()
            why = self._late(req, now_unix)
            if why:  # the queue is scanned for these only now and then: never admit one
                self.waiting.popleft()
                self._reject(req, why, act, ERR_DEADLINE)
                continue
            choice = self.routing.choose(req, self.groups.values())
            if choice is None:
                if self._can_never_fit(req, act):
                    continue
                return  # the head waits for memory; keeping order keeps it fair
            self.waiting.popleft()
            self._place(req, choice.group, choice.matched, act)

    def _admit_by_lane(self, now_unix: float, act: Actions) -> None:
        """Each request in turn goes to the group Routing.prefer names, once that group can take
        it; until then it waits in that group's lane, and so does every later request that
        prefers the same group (first in, first out within a lane), while later requests for
        groups with room go on, as do requests that may overtake (Routing._open). The scan ends
        as LaneRound.over says, or after LANE_SCAN requests."""
        rnd = LaneRound()
        live = [g for g in self.groups.values() if not g.draining]
        for req in list(islice(self.waiting, LANE_SCAN)):
            if not live or rnd.over(live, self.cfg.cache_aware_max_overtake):
                return
            why = self._late(req, now_unix)
            if why:
                self.waiting.remove(req.rid)
                self._reject(req, why, act, ERR_DEADLINE)
                continue
            found = self.routing.prefer(req, live, rnd)
            if found is None:  # too large for every pool, or only for draining groups' (it waits)
                self._can_never_fit(req, act)
                continue
            choice, now = found
            if now:
                self.waiting.remove(req.rid)
                self._place(req, choice.group, choice.matched, act)
                rnd.placed_on(choice.group)
            else:
                rnd.wait_for(choice.group, req)

    def _place(self, req: GenerateReq, g: GroupState, matched: int, act: Actions) -> None:
        key = (g.name, g.instance)
        g.place(req, matched)
        self.where[req.rid] = g.name
        act.admits.setdefault(key, []).append(req)
        act.admit_seqs[key] = g.next_seq
        act.released.append(req.rid)
        self.stats.admitted[g.name] = self.stats.admitted.get(g.name, 0) + 1
        routed = (g.name, self.routing.is_hit(req, matched))
        self.stats.routed[routed] = self.stats.routed.get(routed, 0) + 1
        log.debug(
            "placed on group %s (%d there, %d tokens matched)", g.name, len(g.placed), matched, extra={"rid": req.rid}
        )

    def _can_never_fit(self, req: GenerateReq, act: Actions) -> bool:
        """Reject req if no group could hold it even alone: it would block the queue (or its lane) for ever."""
        biggest = max(g.capacity for g in self.groups.values())
        alone = req.prompt_len + req.params.max_new_tokens
        if alone <= biggest:
            return False
        self.waiting.remove(req.rid)
        why = f"prompt plus max_new_tokens is {alone} KV tokens; the largest worker pool holds {biggest}"
        self._reject(req, why, act, ERR_TOO_LARGE)
        return True

    def seal_admissions(self, act: Actions) -> None:
        """The admissions of this round are sent as one AdmitReqs per group: move the seqs on."""
        for name, _instance in act.admits:
            self.groups[name].next_seq += 1

    def _join(self, st: WorkerStatus, now: float, act: Actions, placed: dict[str, AdmitReqs]) -> GroupState:
        g = GroupState.from_status(st, now)
        self.groups[g.name] = g
        fenced = self.fenced.pop(g.name, None) == st.instance
        if fenced:
            log.warning("worker group %s is back after being declared dead", g.name)
        self._take_placed(g, st, placed, act)
        self._adopt(g, list(g.placed), act, fenced)
        log.info("worker group %s joined: %d KV tokens, %d requests held", g.name, g.capacity, len(g.placed))
        return g

    def _adopt(self, g: GroupState, rids: list[str], act: Actions, fenced: bool) -> None:
        """Requests a group holds that this router did not place there: admitted by a router
        before it restarted, or held by a group declared dead that was only silent (fenced).
        A fenced group's are stopped: each was handed over (its detokenizer drops this copy's
        items) or failed when the group was declared dead. A request still waiting in the queue
        is taken back (a claimed entry of one its group holds already)."""
        for rid in rids:
            if fenced:
                act.abort(g.name, rid)
                continue
            if self.where.get(rid, g.name) != g.name:
                continue
            if self.waiting.remove(rid) is not None:
                act.released.append(rid)
                self._dirty = True
            self.where[rid] = g.name
            if g.placed[rid].req is None:
                self.uncopied.add((g.name, rid))

    def _take_placed(self, g: GroupState, st: WorkerStatus, placed: dict[str, AdmitReqs], act: Actions) -> None:
        """The copies kept of what was placed on a group this router first hears of: a request
        the group lists gets its copy; one placed on an earlier instance (gone unseen: the group
        restarted while no router ran) is handed over; one admitted to this instance and not
        taken in yet is placed there as if by this router; the rest ended."""
        lost = 0
        for rid, admit in placed.items():
            req = admit.reqs[0]
            p = g.placed.get(rid)
            if p is not None:
                p.req = p.req or req
            elif admit.instance == st.instance and admit.seq > st.admit_seq:
                g.place(req, 0)
                g.placed[rid].seq = admit.seq
            else:
                act.forgotten.append((g.name, rid))
                if admit.instance != st.instance and rid not in self.where and rid not in self.waiting:
                    act.handovers.append((req, f"worker group {g.name} restarted"))
                    lost += 1
        self.stats.requeued += lost
        if lost:
            log.warning("handing over %d requests of an earlier instance of group %s", lost, g.name)

    def take_copies(self, copies: dict[str, GenerateReq]) -> None:
        """The copies found of requests learnt from statuses (shared/request_copies.py): with
        one, a request can be handed over should its group die."""
        for rid, req in copies.items():
            g = self.groups.get(self.where.get(rid, ""))
            p = g.placed.get(rid) if g is not None else None
            if p is not None and p.req is None:
                p.req = req

    def _lose_group(self, g: GroupState, why: str, act: Actions) -> None:
        """A group died. Its status lists a request until the request's last item has gone out, so
        every request it still held is unfinished: each goes to its detokenizer shard, which
        sends it back with the output its client has had, to go on elsewhere (_go_on). One
        learnt from a status only (this router restarted since it was placed) whose copy was
        not found in Redis ends with an error."""
        del self.groups[g.name]
        handed = 0
        for rid, p in g.placed.items():
            if self.where.get(rid) != g.name:
                continue  # it runs elsewhere (see _adopt)
            del self.where[rid]
            act.forgotten.append((g.name, rid))
            if p.aborted:
                act.end(p.detok, rid, p.prompt_tokens, FINISH_ABORT)
            elif p.req is not None:
                act.handovers.append((p.req, why))
                handed += 1
            else:
                act.end(p.detok, rid, p.prompt_tokens, FINISH_ERROR, f"{why} while the request was running", ERR_FAILED)
                self.stats.failed += 1
        self.stats.requeued += handed
        self._dirty = True
        if handed:
            log.warning("handing over %d requests of group %s to go on elsewhere", handed, g.name)

    def _expire_waiting(self, now_unix: float, act: Actions) -> None:
        late = self.waiting.take_if(lambda r: bool(self._late(r, now_unix)))
        for req in late:
            self._reject(req, self._late(req, now_unix), act, ERR_DEADLINE)

    def _late(self, req: GenerateReq, now_unix: float) -> str:
        """Why a queued request must end now (its deadline, or the queue-time limit, has passed); "" if not."""
        if req.deadline and req.deadline < now_unix:
            return "deadline exceeded while queued"
        limit = self.cfg.max_queue_time_s
        if limit and now_unix - req.arrival > limit:
            return f"waited more than {limit:g}s in the router's queue"
        return ""

    def _fail_without_groups(self, now: float, act: Actions) -> None:
        """With no worker group alive for as long as it takes to declare one dead, queued
        requests end with an error rather than wait for a group that may never come."""
        if self.groups:
            self._no_group_since = None
            return
        if self._no_group_since is None:
            self._no_group_since = now
        if self.waiting and now - self._no_group_since > self.cfg.worker_dead_after_s:
            for req in self.waiting.take_if(lambda r: True):
                self._reject(req, "no worker group is alive", act, ERR_FAILED)

    def _reject(self, req: GenerateReq, why: str, act: Actions, kind: str) -> None:
        log.warning("rejected: %s", why, extra={"rid": req.rid})
        act.end(req.detok, req.rid, req.prompt_len, FINISH_ERROR, why, kind)
        act.released.append(req.rid)
        self.stats.rejected[kind] = self.stats.rejected.get(kind, 0) + 1
        self._dirty = True  # the queue's head may have changed

    # ---------------------------------------------------------------- figures

    def figures(self, now_unix: float) -> RouterFigures:
        groups = tuple(g.figures() for g in sorted(self.groups.values(), key=lambda g: g.name))
        return RouterFigures(
            waiting=len(self.waiting),
            running=sum(x.running for x in groups),
            paused=sum(x.paused for x in groups),
            max_waiting=self.cfg.max_waiting,
            oldest_wait_s=max(now_unix - self.waiting.head().arrival, 0.0) if self.waiting else 0.0,
            groups=groups,
            admitted=dict(self.stats.admitted),
            routed=dict(self.stats.routed),
            rejected=dict(self.stats.rejected),
            requeued=self.stats.requeued,
            failed=self.stats.failed,
            aborted=self.stats.aborted,
        )
