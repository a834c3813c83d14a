"""The detokenizer service loop: receive, decode, publish.

It reads its shard's stream (registrations from front ends, token batches from
workers and the router), keeps one DetokSession per request, and sends one TextBatch
per step to each front end with requests in it. A stop-string hit also sends an abort
to the router, so the worker frees the request's KV at once. A Handover from the router (the
request's worker group died) is answered with the request to continue: the shard holds every
token its client was sent (docs/router.md, Failures).

A registration stays pending in the stream's consumer group until its request ends; every other
entry is acknowledged with the text it gave, in one transaction. So the stream holds, for each
request still open, its registration and, acknowledged after it, the tokens whose text went
out: a shard that takes the stream over (adoption.py: another shard, or this one restarted)
makes the same sessions again from them and goes on.

On SIGTERM the shard drains (shared/drain.py): its heartbeat says so and front ends register
no new request with it; the requests it holds run to their end. At the drain timeout it lets
its stream go with what is still open, for another shard (or its restart) to take over.
"""

from __future__ import annotations

import logging
import time

from services.detokenizer.adoption import Adoptions, ShardStream
from services.detokenizer.incremental import Decoder
from services.detokenizer.metrics import DetokMetrics
from services.detokenizer.session import DetokSession
from shared.busy_poll import BusyPoll
from shared.drain import Drain
from shared.messages import AbortReq, DetokRegister, GenerateReq, Handover, TextBatch, TextItem, TokenBatch
from shared.redis_link import RedisLink
from shared.redis_streams import Entry, StreamWriter
from shared.streams import StreamNames

log = logging.getLogger(__name__)

TAKEN_OVER_WAIT_MS = 20  # with other shards' streams to read too, the own stream's read waits only this


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
        self.poll = poll or BusyPoll(0.0)
        self.drain = drain
        self.metrics = metrics or DetokMetrics(shard)
        self.names = names
        self.shard = shard
        self.decoder = decoder
        self.adoptions = Adoptions(link, names, shard)
        self.own: ShardStream = self.adoptions.stream(shard)
        self.reader = self.own.reader
        self.writer = StreamWriter(link, maxlen)
        self.sessions: dict[str, DetokSession] = {}
        self.registers: dict[str, Entry] = {}  # rid -> its registration, acknowledged when it ends
        self.deadlines: dict[str, float] = {}
        self._acks: list[Entry] = []  # registrations of sessions ended outside handle()
        self._next_gc = 0.0

    def take_own_stream(self) -> None:
        """Wait until this shard's stream is ours (a shard that took it over while this one was
        down lets it go when its requests have ended), then take over what it holds."""
        waited = False
        while not self.own.owner.hold():
            if not waited:
                log.warning("shard %s's stream is held by %s: waiting", self.shard, self.own.owner.holder())
                waited = True
            if self.link.stop.wait(0.5) or self.draining:  # told to stop before it served
                return
        self._restore(self.own)

    def run(self) -> None:
        log.info("detokenizer shard %s reading %s", self.shard, self.names.detok(self.shard))
        while not self.link.stop.is_set():
            if self.drain is not None and self.drain.over(bool(self.sessions)):
                self._let_go()
                return
            held, taken = self.adoptions.look(self.own)
            if not held:
                log.error("shard %s's stream is held by %s now: stopping", self.shard, self.own.owner.holder())
                return
            for s in taken:
                self._restore(s)
            others = list(self.adoptions.taken.values())
            wait_ms = TAKEN_OVER_WAIT_MS if others or self.draining else 500
            entries = self.poll.read(self.reader, count=512, wait_ms=wait_ms)
            for s in others:
                entries += s.reader.read(count=512)
            self.handle(entries)
            self.poll.note(bool(self.sessions))
            self._collect_expired()
            if others:
                self.adoptions.give_back(self._open_by_shard())

    @property
    def draining(self) -> bool:
        return self.drain is not None and self.drain.draining

    def handle(self, entries: list[Entry]) -> None:
        started = time.perf_counter()
        texts: dict[str, list[TextItem]] = {}
        aborts: list[str] = []
        handed: list[GenerateReq] = []
        acks, self._acks = self._acks, []
        for entry in entries:
            msg = entry.msg
            if isinstance(msg, DetokRegister):
                self._open(msg, entry)
                continue  # acknowledged when the request ends
            acks.append(entry)
            if isinstance(msg, Handover):
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
                    if session.repeated(item):
                        log.warning("a token batch came twice; dropped", extra={"rid": item.rid})
                        continue
                    text, ended = session.apply(item)
                    texts.setdefault(session.front, []).append(text)
                    if ended:
                        acks += self._close(item.rid)
                        if not item.finish_reason:  # ended here, not in the worker
                            aborts.append(item.rid)
            else:
                log.error("unexpected %s on the detokenizer stream", type(msg).__name__)
        self.metrics.on_handle(entries, texts, len(aborts), time.perf_counter() - started)
        out = [(self.names.front(front), TextBatch(items)) for front, items in texts.items()]
        out += [(self.names.router, AbortReq(rid, "ended by the detokenizer")) for rid in aborts]
        out += [(self.names.router, req) for req in handed]
        self.writer.send_many(out, acks=acks)

    def _open(self, reg: DetokRegister, entry: Entry) -> None:
        self.sessions[reg.rid] = DetokSession(reg, self.decoder)
        self.registers[reg.rid] = entry
        self.deadlines[reg.rid] = reg.deadline

    def _close(self, rid: str) -> list[Entry]:
        """The request has ended: -> its registration, to acknowledge."""
        self.sessions.pop(rid, None)
        self.deadlines.pop(rid, None)
        entry = self.registers.pop(rid, None)
        return [entry] if entry is not None else []

    def _restore(self, s: ShardStream) -> None:
        """Take a shard stream's pending entries over: the sessions of its open requests made again
        from their registrations and the acknowledged entries after them (what the reader before
        did, its text sent: nothing is sent again), then the rest handled as usual."""
        taken, done = s.reader.take_over()
        regs = [e for e in taken if isinstance(e.msg, DetokRegister)]
        for e in regs:
            self._open(e.msg, e)
        restored = {e.msg.rid for e in regs}
        for e in done:
            self._replay(e, restored)
        if regs:
            log.warning("took over %d open requests of shard %s", len(regs), s.shard)
        self.handle([e for e in taken if not isinstance(e.msg, DetokRegister)])

    def _replay(self, entry: Entry, restored: set[str]) -> None:
        msg = entry.msg
        if isinstance(msg, Handover) and msg.req.rid in restored:
            self.sessions[msg.req.rid].hand_over(msg.req)
        elif isinstance(msg, TokenBatch):
            for item in msg.items:
                session = self.sessions.get(item.rid) if item.rid in restored else None
                if session is None or (msg.source != "router" and session.stale(item)) or session.repeated(item):
                    continue
                if session.apply(item)[1]:  # it ended then (its registration is acknowledged)
                    self._acks += self._close(item.rid)

    def _open_by_shard(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in self.registers.values():
            shard = entry.stream[len(self.names.detok("")) :]
            out[shard] = out.get(shard, 0) + 1
        return out

    def _let_go(self) -> None:
        """The drain timed out: the requests still open stay pending in the streams, for another
        shard (or this one restarted) to take over; the streams are let go at once."""
        if self.sessions:
            log.warning("drain timeout: %d requests left open for another shard to take over", len(self.sessions))
        self.writer.send_many([], acks=self._acks)
        self._acks = []
        self.adoptions.release_all()
        self.own.owner.release()

    def _collect_expired(self) -> None:
        """Drop sessions past their deadline whose end never came (their front end has given up)."""
        now = time.time()
        if now < self._next_gc:
            return
        self._next_gc = now + 5.0
        for rid in [rid for rid, d in self.deadlines.items() if d and d + 30.0 < now]:
            log.warning("dropping a session past its deadline", extra={"rid": rid})
            self._acks += self._close(rid)
