"""The detokenizer service loop: receive, decode, publish.

It reads its shard's stream (registrations from front ends, token batches from
workers and the router), keeps one DetokSession per request, and sends one TextBatch
per step to each front end with requests in it. A stop-string hit also sends an abort
to the router, so the worker frees the request's KV at once. A Handover from the router (the
request's worker group died) is answered with the request to continue: the shard holds every
token its client was sent (docs/router.md, Failures).

On SIGTERM the shard drains (shared/drain.py): its heartbeat says so and front ends register
no new request with it; the requests it holds run to their end. Those still open when the
drain timeout passes end with an explicit error, and are aborted on their worker groups.
"""

from __future__ import annotations

import logging
import time

from services.detokenizer.incremental import Decoder
from services.detokenizer.metrics import DetokMetrics
from services.detokenizer.session import DetokSession
from shared.busy_poll import BusyPoll
from shared.drain import Drain
from shared.messages import AbortReq, DetokRegister, GenerateReq, Handover, TextBatch, TextItem, TokenBatch
from shared.redis_link import RedisLink
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.streams import GROUP_DETOK, StreamNames

log = logging.getLogger(__name__)


class DetokenizerService:
    def __init__(
        self,
        link: RedisLink,
        names: StreamNames,
        shard: str,
        decoder: Decoder,
        maxlen: int,
        metrics: DetokMetrics | None = None,
        poll: BusyPoll | None = None,
        drain: Drain | None = None,
    ) -> None:
        self.link = link
        self.drain = drain
        self.poll = poll or BusyPoll(0.0)
        self.metrics = metrics or DetokMetrics(shard)
        self.names = names
        self.shard = shard
        self.decoder = decoder
        self.reader = StreamReader(link, names.detok(shard), GROUP_DETOK, consumer=shard)
        self.writer = StreamWriter(link, maxlen)
        self.sessions: dict[str, DetokSession] = {}
        self.deadlines: dict[str, float] = {}
        self._next_gc = 0.0

    def run(self) -> None:
        log.info("detokenizer shard %s reading %s", self.shard, self.names.detok(self.shard))
        while not self.link.stop.is_set():
            if self.drain is not None and self.drain.over(bool(self.sessions)):
                self._fail_open("the detokenizer shut down (drain timeout passed)")
                return
            entries = self.poll.read(self.reader, count=512, wait_ms=100 if self.draining else 500)
            self.handle(entries)
            self.poll.note(bool(self.sessions))
            self._collect_expired()

    @property
    def draining(self) -> bool:
        return self.drain is not None and self.drain.draining

    def _fail_open(self, why: str) -> None:
        """End every open session with an explicit error, and stop its request on its group."""
        if self.sessions:
            log.warning("%d requests still open: %s", len(self.sessions), why)
        texts: dict[str, list[TextItem]] = {}
        for session in self.sessions.values():
            texts.setdefault(session.front, []).append(session.fail(why))
        out: list[tuple[str, object]] = [(self.names.front(f), TextBatch(items)) for f, items in texts.items()]
        out += [(self.names.router, AbortReq(rid, why)) for rid in self.sessions]
        self.writer.send_many(out)
        self.sessions.clear()
        self.deadlines.clear()

    def handle(self, entries: list[Entry]) -> None:
        started = time.perf_counter()
        texts: dict[str, list[TextItem]] = {}
        aborts: list[str] = []
        handed: list[GenerateReq] = []
        for entry in entries:
            msg = entry.msg
            if isinstance(msg, DetokRegister):
                self.sessions[msg.rid] = DetokSession(msg, self.decoder)
                self.deadlines[msg.rid] = msg.deadline
            elif isinstance(msg, Handover):
                session = self.sessions.get(msg.req.rid)
                if session is not None:  # else it ended: its last item came before the group died
                    handed.append(session.hand_over(msg.req))
                    log.warning(
                        "handed over with %d tokens: %s", session.output_tokens, msg.why, extra={"rid": msg.req.rid}
                    )
            elif isinstance(msg, TokenBatch):
                from_worker = msg.source != "router"  # the router's items end a request: never stale
                for item in msg.items:
                    session = self.sessions.get(item.rid)
                    if session is None or (from_worker and session.stale(item)):
                        continue  # ended already (stop string hit; its abort is in flight), or handed over
                    text, ended = session.apply(item)
                    texts.setdefault(session.front, []).append(text)
                    if ended:
                        self._close(item.rid)
                        if not item.finish_reason:  # ended here, not in the worker
                            aborts.append(item.rid)
            else:
                log.error("unexpected %s on the detokenizer stream", type(msg).__name__)
        self.metrics.on_handle(entries, texts, len(aborts), time.perf_counter() - started)
        out = [(self.names.front(front), TextBatch(items)) for front, items in texts.items()]
        out += [(self.names.router, AbortReq(rid, "ended by the detokenizer")) for rid in aborts]
        out += [(self.names.router, req) for req in handed]
        self.writer.send_many(out, acks=entries)

    def _close(self, rid: str) -> None:
        self.sessions.pop(rid, None)
        self.deadlines.pop(rid, None)

    def _collect_expired(self) -> None:
        """Drop sessions past their deadline whose end never came (their front end has given up)."""
        now = time.time()
        if now < self._next_gc:
            return
        self._next_gc = now + 5.0
        for rid in [rid for rid, d in self.deadlines.items() if d and d + 30.0 < now]:
            log.warning("dropping a session past its deadline", extra={"rid": rid})
            self._close(rid)
