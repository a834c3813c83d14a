"""The router service loop: receive, decide (RouterCore), publish.

A GenerateReq stays pending in the router's consumer group while it waits in the
queue; it is acknowledged in the same transaction that sends its AdmitReqs (or its
rejection), so a router that dies loses nothing: its successor claims the pending
entries and rebuilds its view of the worker groups from their next statuses.
"""

from __future__ import annotations

import logging
import time

from services.router.core import Actions, RouterCore
from shared.config import RouterConfig
from shared.messages import AbortReq, AbortReqs, AdmitReqs, GenerateReq, TokenBatch, WorkerStatus
from shared.redis_link import RedisLink
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.streams import GROUP_ROUTER, StreamNames

log = logging.getLogger(__name__)


class RouterService:
    def __init__(self, cfg: RouterConfig, link: RedisLink) -> None:
        self.cfg = cfg
        self.link = link
        self.names = StreamNames(cfg.namespace)
        self.core = RouterCore(cfg)
        self.reader = StreamReader(link, self.names.router, GROUP_ROUTER, consumer=cfg.replica)
        self.writer = StreamWriter(link, cfg.stream_maxlen)
        self.queued: dict[str, Entry] = {}  # rid -> its GenerateReq entry, unacknowledged while queued
        self._next_log = 0.0

    def run(self) -> None:
        log.info("router reading %s", self.names.router)
        while not self.link.stop.is_set():
            idle = not self.core.waiting
            entries = self.reader.read(count=1024, block_ms=200 if idle else 5)
            self.step(entries)

    def step(self, entries: list[Entry]) -> None:
        act = Actions()
        now, now_unix = time.monotonic(), time.time()
        done: list[Entry] = []
        for entry in entries:
            msg = entry.msg
            if isinstance(msg, GenerateReq):
                self.queued[msg.rid] = entry
                self.core.on_generate(msg, now_unix, act)
            elif isinstance(msg, AbortReq):
                self.core.on_abort(msg.rid, act)
                done.append(entry)
            elif isinstance(msg, WorkerStatus):
                self.core.on_status(msg, now, act)
                done.append(entry)
            else:
                log.error("unexpected %s on the router stream", type(msg).__name__)
                done.append(entry)
        self.core.tick(now, now_unix, act)
        self._publish(act, done)
        self._log_figures(now)

    def _publish(self, act: Actions, done: list[Entry]) -> None:
        out: list[tuple[str, object]] = []
        for (group, instance), reqs in act.admits.items():
            out.append((self.names.worker(group), AdmitReqs(instance, act.admit_seqs[(group, instance)], reqs)))
        for group, rids in act.aborts.items():
            out.append((self.names.worker(group), AbortReqs(rids, "aborted")))
        for detok, items in act.ended.items():
            out.append((self.names.detok(detok), TokenBatch("router", items)))
        acks = done + [e for rid in act.released if (e := self.queued.pop(rid, None)) is not None]
        self.writer.send_many(out, acks=acks)
        self.core.seal_admissions(act)

    def _log_figures(self, now: float) -> None:
        if now < self._next_log:
            return
        self._next_log = now + self.cfg.status_log_every_s
        figures = " ".join(f"{k}={v}" for k, v in self.core.figures().items())
        log.info("router %s", figures)
