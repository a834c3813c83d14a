"""The worker service loop: receive, schedule and run a step, publish.

The loop reads its stream (admitted requests and aborts) itself: without waiting while the
engine has work, else waiting until a message comes or a status is due (polling in the
busy-poll window, shared/busy_poll.py). Its Redis round trips overlap the device's work:
the engine launches a step before it collects the one before. Each step's tokens go to the
detokenizer shards (one TokenBatch per shard per step) and the group's status to the
router. A status goes out every status_interval_s and soon after any step that freed
memory or started a request's output, and doubles as the group's heartbeat. It lists a request
until the request's last item has been sent, so the router may take its absence for its end.

On SIGTERM the group drains (shared/drain.py): its statuses say so, and the router places
nothing more on it; it runs what it holds to the end. When nothing is left, or the drain timeout
has passed, its last status (``leaving``) lists what has not ended, and the router hands each of
those over to go on on another group, as it does for a dead group's (docs/router.md, Failures).

An entry is acknowledged after its side effect (the engine holds the request, and its
prefill step is launched): with the next message sent, in the same transaction, or in the
next read's round trip, whichever comes first.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid

from services.worker.engine import Engine
from services.worker.image_intake import ImageIntake
from services.worker.metrics import WorkerMetrics
from shared.busy_poll import BusyPoll
from shared.drain import Drain
from shared.messages import (
    ERR_FAILED,
    FINISH_ERROR,
    AbortReqs,
    AdmitReqs,
    GenerateReq,
    TokenBatch,
    TokenItem,
    WorkerStatus,
)
from shared.redis_link import RedisLink, Stopping
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.streams import GROUP_WORKER, StreamNames

log = logging.getLogger(__name__)

CHANGE_STATUS_MIN_GAP_S = 0.02  # statuses caused by a change, at most this often
COMPILE_POLL_MS = 1  # while only grammars compile, the loop reads for this long between looks at them


class WorkerService:
    def __init__(
        self,
        engine: Engine,
        link: RedisLink,
        names: StreamNames,
        group: str,
        status_interval_s: float,
        maxlen: int,
        metrics: WorkerMetrics | None = None,
        poll: BusyPoll | None = None,
        drain: Drain | None = None,
        images: ImageIntake | None = None,
    ) -> None:
        self.engine = engine
        self.drain = drain
        self.images = images  # a vision-language model's: requests' images' embeddings from Redis
        self.metrics = metrics or WorkerMetrics(group)
        self.link = link
        self.names = names
        self.group = group
        self.instance = uuid.uuid4().hex[:12]
        self.status_interval_s = status_interval_s
        self.reader = StreamReader(link, names.worker(group), GROUP_WORKER, consumer=f"{group}-{self.instance}")
        self.writer = StreamWriter(link, maxlen)
        self.poll = poll or BusyPoll(0.0)  # an idle loop's reads poll for a while after its last work
        self.admit_seq = 0
        self._last_status = 0.0
        self._changed = False
        self._acks: list[Entry] = []  # taken in, acknowledged with the next message sent or read

    def run(self) -> None:
        self.publish_status()
        log.info("worker group %s (instance %s) serving", self.group, self.instance)
        why = "the worker is shutting down"
        leaving = False
        try:
            while not self.link.stop.is_set():
                if self.drain is not None and self._drain_over():
                    leaving = True
                    break
                entries = self.poll.read(self.reader, 256, self._wait_ms(), acks=self._acks)
                self._acks = []
                self._take(entries)
                busy = self.engine.has_work()
                self.poll.note(busy)
                if busy:
                    started = time.perf_counter()
                    out = self.engine.step()
                    self.metrics.on_step(out, time.perf_counter() - started)
                    self._publish_tokens(out.items)
                    self._changed |= out.changed
                self._maybe_status()
        except Stopping:  # stopped while Redis was away
            pass
        except Exception as e:  # a step failed (a tensor-parallel rank died, the device failed, ...)
            log.exception("the step loop failed")
            why = f"the worker failed: {type(e).__name__}: {str(e)[:200]}"
            raise
        finally:
            with contextlib.suppress(Stopping):
                if leaving:  # what it holds goes on elsewhere: the router hands it over
                    self.publish_status(leaving=True)
                else:
                    self._publish_tokens(self.engine.fail_all(why))
                    self._send([], flush=True)

    def _drain_over(self) -> bool:
        """Draining: the first turn that sees it tells the router at once (it places nothing more
        here); over once nothing is left or the timeout has passed."""
        assert self.drain is not None
        first = self.drain.draining and self.drain.began is None
        over = self.drain.over(self.engine.has_work())
        if first:
            log.info("draining: %d requests held", len(self.engine.running_reqs()))
            self.publish_status()
        if over:
            held = len(self.engine.running_reqs())
            if held:
                log.warning("drain timeout: %d requests go on on another group", held)
            else:
                log.info("drained")
        return over

    def abandon(self, why: str) -> None:
        """The group cannot go on (a rank died): end every request it holds with an explicit
        error at once. Called from another thread while the step loop may be stuck in a
        collective, so it sends with a writer of its own."""
        log.error("abandoning every request: %s", why)
        try:
            items = self.engine.fail_all(why)
        except Exception:  # the step loop may be changing the state under us: say what we can
            log.exception("could not list the requests to fail")
            items = []
        by_shard: dict[str, list[TokenItem]] = {}
        for shard, item in items:
            by_shard.setdefault(shard, []).append(item)
        source = f"worker:{self.group}"
        StreamWriter(self.link).send_many(
            [(self.names.detok(s), TokenBatch(source, its)) for s, its in by_shard.items()]
        )

    def _take(self, entries: list[Entry]) -> None:
        for entry in entries:
            msg = entry.msg
            if isinstance(msg, AdmitReqs):
                if msg.instance != self.instance:
                    log.warning("ignoring %d admissions addressed to instance %s", len(msg.reqs), msg.instance)
                    continue
                self._admit(msg.reqs)
                self.admit_seq = max(self.admit_seq, msg.seq)
            elif isinstance(msg, AbortReqs):
                for rid in msg.rids:
                    self.engine.abort(rid)
            else:
                log.error("unexpected %s on the worker stream", type(msg).__name__)
        # the side effect (the engine holds them) is done; the acknowledgement goes out after the
        # next step launched, with its tokens or the next read, so nothing sits between an
        # admission and its prefill
        self._acks += entries

    def _admit(self, reqs: list[GenerateReq]) -> None:
        """Into the engine, each with its images' embeddings (one Redis round trip for all); a
        request whose images cannot be had ends at once with an explicit error."""
        spans = self.images.spans(reqs) if self.images is not None else {}
        failed = []
        for req in reqs:
            got = spans.get(req.rid)
            if req.images and got is None:
                got = "the request has images, but this worker serves a text-only model"
            if isinstance(got, str):
                log.error("failing: %s", got, extra={"rid": req.rid})
                item = TokenItem(req.rid, [], finish_reason=FINISH_ERROR, error=got, error_kind=ERR_FAILED)
                failed.append((req.detok, item))
            else:
                self.engine.add(req, got)
        if failed:
            self._publish_tokens(failed)

    def _send(self, items: list[tuple[str, object]], flush: bool = False) -> None:
        """Send items with the acknowledgements taken in since the last send, in one transaction.
        Acknowledgements alone wait for the next read's round trip, unless ``flush``."""
        if items or flush:
            acks, self._acks = self._acks, []
            self.writer.send_many(items, acks=acks)

    def _publish_tokens(self, items: list[tuple[str, TokenItem]]) -> None:
        by_shard: dict[str, list[TokenItem]] = {}
        for shard, item in items:
            by_shard.setdefault(shard, []).append(item)
        source = f"worker:{self.group}"
        self._send([(self.names.detok(s), TokenBatch(source, its)) for s, its in by_shard.items()])

    def _wait_ms(self) -> int:
        """How long the loop may wait for messages: not at all with work in hand, and never past
        the moment a pending change's status is due."""
        if self.engine.has_work():
            return 0
        if self.engine.compiling():  # a grammar is compiling in its thread: look again soon
            return COMPILE_POLL_MS
        if self._changed:
            return max(0, round(1000 * (CHANGE_STATUS_MIN_GAP_S - (time.monotonic() - self._last_status))))
        return round(500 * self.status_interval_s)

    def _maybe_status(self) -> None:
        now = time.monotonic()
        since = now - self._last_status
        if since >= self.status_interval_s or (self._changed and since >= CHANGE_STATUS_MIN_GAP_S):
            self.publish_status()

    def publish_status(self, leaving: bool = False) -> None:
        kv = self.engine.kv
        status = WorkerStatus(
            group=self.group,
            instance=self.instance,
            capacity_tokens=kv.capacity,
            free_tokens=kv.free_tokens,
            max_running=self.engine.scheduler.limits.max_running,
            admit_seq=self.admit_seq,
            running=self.engine.running_reqs(),
            time=time.time(),
            evictable_tokens=kv.evictable_tokens,
            cache_locked_tokens=kv.cache_locked_tokens,
            prompt_cache=kv.cache is not None,
            draining=self.drain is not None and self.drain.draining,
            leaving=leaving,
        )
        self._send([(self.names.router, status)])
        self._last_status = time.monotonic()
        self._changed = False
