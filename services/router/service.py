"""The router service loop: receive, decide (RouterCore), publish.

A GenerateReq stays pending in the router's consumer group while it waits in the
queue; it is acknowledged in the same transaction that sends its AdmitReqs (or its
rejection), so a router that dies loses nothing: its successor claims the pending
entries and rebuilds its view of the worker groups from their next statuses. A request
of a lost group (its entry acknowledged long ago) goes to its detokenizer shard as a
Handover, and comes back on the router's stream as a new entry, held until it is admitted
again: at every moment one stream holds it. A copy of each request placed is kept in Redis
while it runs (shared/request_copies.py), so a router that restarts can hand over the requests
its predecessor placed as well, those of a group instance that died unseen included.

While Redis is unreachable the read waits (RedisLink retries), and no status can arrive:
the time it was away is not counted towards any group's death (RouterCore.excuse_silence).
"""

from __future__ import annotations

import logging
import time
import uuid

from services.router.actions import Actions
from services.router.core import RouterCore
from services.router.metrics import RouterFigures
from shared.busy_poll import BusyPoll
from shared.config import RouterConfig
from shared.messages import AbortReq, AbortReqs, AdmitReqs, GenerateReq, Handover, TokenBatch, WorkerStatus
from shared.redis_link import RedisLink
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.request_copies import RequestCopies
from shared.streams import GROUP_ROUTER, StreamNames

log = logging.getLogger(__name__)

# Admission changes only when a message arrives (a status, a request, an abort), and a
# read returns as soon as one does; the wait only bounds how late the clock's own events
# (a silent group declared dead, a queued request's deadline) can be noticed.
READ_BLOCK_MS = 100


class RouterService:
    def __init__(self, cfg: RouterConfig, link: RedisLink, poll: BusyPoll | None = None) -> None:
        self.cfg = cfg
        self.poll = poll or BusyPoll(0.0)
        self.link = link
        self.names = StreamNames(cfg.namespace)
        self.core = RouterCore(cfg)
        # a consumer name of its own per run: a restarted router under the same replica name
        # would otherwise never be handed its predecessor's pending entries (a reader claims
        # only other consumers'), so the queued requests would be stranded
        consumer = f"{cfg.replica}-{uuid.uuid4().hex[:8]}"
        self.reader = StreamReader(link, self.names.router, GROUP_ROUTER, consumer=consumer)
        self.writer = StreamWriter(link, cfg.stream_maxlen)
        self.copies = RequestCopies(link, self.names)
        self.queued: dict[str, Entry] = {}  # rid -> its GenerateReq entry, unacknowledged while queued
        self.figures = RouterFigures(max_waiting=cfg.max_waiting)  # the latest snapshot, read by other threads
        self._next_log = 0.0
        self._excused = 0.0  # the end of the last Redis outage the core was told of

    def run(self) -> None:
        log.info("router reading %s", self.names.router)
        while not self.link.stop.is_set():
            entries = self.poll.read(self.reader, count=1024, wait_ms=READ_BLOCK_MS)
            self.step(entries)
            self.poll.note(bool(self.queued) or bool(self.core.where))  # requests waiting or running

    def step(self, entries: list[Entry]) -> None:
        act = Actions()
        now, now_unix = time.monotonic(), time.time()
        done: list[Entry] = []
        for entry in entries:
            msg = entry.msg
            if isinstance(msg, GenerateReq):
                if msg.rid in self.queued:
                    done.append(entry)  # a second copy of a request whose entry is held already
                else:
                    self.queued[msg.rid] = entry
                    self.core.on_generate(msg, now_unix, act)
            elif isinstance(msg, AbortReq):
                self.core.on_abort(msg.rid, now, act)
                done.append(entry)
            elif isinstance(msg, WorkerStatus):
                placed = self.copies.of_group(msg.group) if self.core.first_heard(msg) else None
                self.core.on_status(msg, now, act, placed)
                done.append(entry)
            else:
                log.error("unexpected %s on the router stream", type(msg).__name__)
                done.append(entry)
        if self.link.recovered_at > self._excused:  # redis was unreachable: no group could send a status
            log.warning("redis was unreachable: the worker groups' death clocks start again")
            self._excused = self.link.recovered_at
            self.core.excuse_silence(self._excused)
        if self.core.uncopied:  # learnt from later statuses (placed by a predecessor): their copies
            wanted, self.core.uncopied = self.core.uncopied, set()
            for group in {g for g, _ in wanted}:
                self.core.take_copies(self.copies.get(group, [rid for g, rid in wanted if g == group]))
        self.core.tick(now, now_unix, act)
        self._publish(act, done)
        self.figures = self.core.figures(now_unix)
        self._log_figures(now)

    def _publish(self, act: Actions, done: list[Entry]) -> None:
        out: list[tuple[str, object]] = []
        for (group, instance), reqs in act.admits.items():
            out.append((self.names.worker(group), AdmitReqs(instance, act.admit_seqs[(group, instance)], reqs)))
        for group, rids in act.aborts.items():
            out.append((self.names.worker(group), AbortReqs(rids, "aborted")))
        for detok, items in act.ended.items():
            out.append((self.names.detok(detok), TokenBatch("router", items)))
        out += [(self.names.detok(req.detok), Handover(req, why)) for req, why in act.handovers]
        acks = done + [e for rid in act.released if (e := self.queued.pop(rid, None)) is not None]
        copies = self.copies.puts(act.admits, act.admit_seqs)
        self.writer.send_many(out, acks=acks, put=copies, drop=self.copies.drops(act.forgotten))
        self.core.seal_admissions(act)

    def _log_figures(self, now: float) -> None:
        if now < self._next_log:
            return
        self._next_log = now + self.cfg.status_log_every_s
        log.info("router %s", " ".join(f"{k}={v:g}" for k, v in self.figures.info().items()))
