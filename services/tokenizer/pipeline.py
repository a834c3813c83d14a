"""The front end's side of the pipeline: submit requests, receive their text, watch health.

Submitting registers the request with a detokenizer shard and then sends it to the
router (in that order, in one round trip, so the shard knows it before any token can
arrive). A task on the event loop reads TextBatch messages from this front end's stream
and puts each item, tagged with its generation's index, on the asyncio queue of the HTTP
request waiting for it (one queue for all the generations of a request). The reads are
asynchronous (StreamReader.aread, redis.asyncio): polls while requests are in flight and a
while after (shared/busy_poll.py), else blocking reads. A watchdog thread fails in-flight
requests when no worker group or their detokenizer shard is alive any more.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
import zlib
from dataclasses import dataclass, field

from services.tokenizer.errors import APIError
from shared.busy_poll import BusyPoll
from shared.heartbeat import live_replicas
from shared.messages import (
    ERR_FAILED,
    ERR_TOO_LARGE,
    FINISH_ERROR,
    AbortReq,
    DetokRegister,
    GenerateReq,
    Heartbeat,
    SamplingParams,
    TextBatch,
    TextItem,
)
from shared.redis_link import TRANSIENT, NotAtOnce, RedisLink, Stopping
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.streams import GROUP_FRONT, SERVICE_DETOK, SERVICE_ROUTER, SERVICE_WORKER, StreamNames

log = logging.getLogger(__name__)

READ_WAIT_MS = 500  # the longest one read of the replies waits
READ_RETRY_S = 0.5  # after a failed read of the replies (Redis away), the next one waits this long
AT_ONCE_MAX_PENDING = 4  # generations in flight (this one included) up to which a submission is sent from the loop


class Unavailable(Exception):
    """The pipeline cannot take a request now (no worker, detokenizer or router alive, or the queue is full)."""


@dataclass
class PendingRequest:
    rid: str
    detok: str
    detok_started: float  # the shard's start time, to notice a restart
    prompt_tokens: int
    queue: asyncio.Queue[tuple[int, TextItem]]  # shared by the generations of one HTTP request
    index: int  # this generation's index among its request's, the tag of its items in the queue
    finished: bool = False


@dataclass
class Liveness:
    workers: dict[str, Heartbeat] = field(default_factory=dict)
    detoks: dict[str, Heartbeat] = field(default_factory=dict)
    routers: dict[str, Heartbeat] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return bool(self.workers and self.detoks and self.routers)


class Pipeline:
    def __init__(
        self,
        link: RedisLink,
        names: StreamNames,
        front_id: str,
        maxlen: int,
        dead_after_s: float,
        check_s: float,
        poll: BusyPoll | None = None,
    ) -> None:
        self.link = link
        self.names = names
        self.front_id = front_id
        self.dead_after_s = dead_after_s
        self.check_s = check_s
        self.writer = StreamWriter(link, maxlen)
        self.reader = StreamReader(link, names.front(front_id), GROUP_FRONT, consumer=front_id)
        self.pending: dict[str, PendingRequest] = {}
        self.live = Liveness()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poll = poll or BusyPoll(0.0)
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="redis-io")
        self._watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._tasks: list[asyncio.Task[None]] = []

    # ---------------------------------------------------------------- lifecycle

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._refresh_liveness()
        self._watchdog.start()
        self._tasks = [loop.create_task(self._read_replies())]

    def stop(self) -> None:
        self.link.stop.set()
        for task in self._tasks:
            task.cancel()
        self._io.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- requests

    async def submit(
        self,
        rid: str,
        input_ids: list[int],
        params: SamplingParams,
        stop: list[str],
        skip_special_tokens: bool,
        deadline: float,
        queue: asyncio.Queue[tuple[int, TextItem]],
        index: int,
    ) -> PendingRequest:
        if not self.live.workers:
            raise Unavailable("no worker is alive")
        if not self.live.routers:
            raise Unavailable("the router is not alive")
        self._refuse_early(len(input_ids) + params.max_new_tokens)
        shard = self._pick_detok(rid)
        pending = PendingRequest(rid, shard.replica, shard.started, len(input_ids), queue, index)
        self.pending[rid] = pending
        register = DetokRegister(rid, self.front_id, len(input_ids), stop, skip_special_tokens, deadline)
        gen = GenerateReq(rid, self.front_id, shard.replica, input_ids, params, time.time(), deadline)
        items = [(self.names.detok(shard.replica), register), (self.names.router, gen)]
        try:
            if not self._sent_at_once(items):
                await asyncio.get_running_loop().run_in_executor(self._io, self.writer.send_many, items)
        except BaseException:
            self.pending.pop(rid, None)
            raise
        return pending

    def _sent_at_once(self, items: list[tuple[str, object]]) -> bool:
        """With few requests in flight, send from the event loop itself: handing the send to the
        I/O pool costs a thread wake-up (0.15-0.2 ms) before the request leaves. Under load the
        pool keeps the loop free; and if Redis does not answer at once, the pool's retrying
        send takes over."""
        if len(self.pending) > AT_ONCE_MAX_PENDING:
            return False
        try:
            self.writer.send_many(items, once=True)
        except NotAtOnce:
            return False
        return True

    def abort(self, rid: str, reason: str) -> None:
        """The client went away: stop the request wherever it is. Does not wait (it may be
        called from a cancelled task), the abort is sent from the I/O pool."""
        pending = self.pending.pop(rid, None)
        if pending is None or pending.finished:
            return
        log.info("aborting: %s", reason, extra={"rid": rid})
        self._io.submit(self.writer.send, self.names.router, AbortReq(rid, reason))

    def fail_all(self, why: str) -> int:
        """End every generation in flight with an error item and abort it (on the loop: the
        drain's last step). Returns how many there were."""
        failing = [p for p in self.pending.values() if not p.finished]
        for p in failing:
            p.queue.put_nowait((p.index, _error_item(p, why)))
            self.abort(p.rid, why)
        return len(failing)

    def done(self, rid: str) -> None:
        pending = self.pending.pop(rid, None)
        if pending is not None:
            pending.finished = True

    def _refuse_early(self, total_tokens: int) -> None:
        """Answer at once, from the heartbeats, what the router would answer after a round trip:
        a request no worker pool could ever hold (400), or a full queue (503)."""
        largest = max((hb.info.get("capacity_tokens", 0.0) for hb in self.live.workers.values()), default=0.0)
        if largest and total_tokens > largest:
            why = f"prompt plus max_new_tokens is {total_tokens} KV tokens; the largest worker pool holds {largest:.0f}"
            raise APIError(400, why, ERR_TOO_LARGE)
        for hb in self.live.routers.values():
            waiting, bound = hb.info.get("waiting", 0.0), hb.info.get("max_waiting", 0.0)
            if bound and waiting >= bound:
                raise Unavailable(f"overloaded: {int(waiting)} requests are waiting")

    def _pick_detok(self, rid: str) -> Heartbeat:
        shards = sorted(self.live.detoks)
        if not shards:
            raise Unavailable("no detokenizer is alive")
        return self.live.detoks[shards[zlib.crc32(rid.encode()) % len(shards)]]

    # ---------------------------------------------------------------- threads

    async def _read_replies(self) -> None:
        """Reads one at a time, so each request's items keep their order; a read's entries are
        acknowledged in the next read's round trip. A failed read's acknowledgements go with the
        next one, which also recovers what the failed one may have taken."""
        acks: list[Entry] = []
        try:
            while not self.link.stop.is_set():
                self.poll.note(bool(self.pending))
                try:
                    entries = await self.poll.aread(self.reader, 256, READ_WAIT_MS, acks)
                except TRANSIENT as e:  # Redis away or slow
                    log.warning("reading replies failed (%s: %s); retrying", type(e).__name__, e)
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                except Exception:
                    log.exception("reading replies failed; retrying")
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                acks = entries
                self._hand_out(entries)
                if entries and len(self.pending) <= AT_ONCE_MAX_PENDING:
                    # the requests' tasks run to their chunks before the next read is sent
                    await asyncio.sleep(0)
        finally:
            await self.reader.aclose()

    def _hand_out(self, entries: list[Entry]) -> None:
        """Each item to the queue of the request it belongs to (on the loop)."""
        for entry in entries:
            if isinstance(entry.msg, TextBatch):
                for item in entry.msg.items:
                    pending = self.pending.get(item.rid)
                    if pending is not None:
                        pending.queue.put_nowait((pending.index, item))

    def _deliver(self, deliveries: list[tuple[PendingRequest, TextItem]]) -> None:
        """From another thread (the watchdog)."""

        def put_all() -> None:
            for pending, item in deliveries:
                pending.queue.put_nowait((pending.index, item))

        assert self.loop is not None
        self.loop.call_soon_threadsafe(put_all)

    def _watch(self) -> None:
        while not self.link.stop.wait(self.check_s):
            try:
                self._refresh_liveness()
                self._fail_orphans()
            except Stopping:
                return
            except Exception:
                log.exception("health check failed")

    def _refresh_liveness(self) -> None:
        before = self.live

        def fresh(service: str, known: dict[str, Heartbeat]) -> dict[str, Heartbeat]:
            beats = live_replicas(self.link, self.names, service)
            now = time.time()
            alive = {name: hb for name, hb in beats.items() if now - hb.time <= self.dead_after_s}
            # for as long as it takes to declare a replica dead after Redis came back, those
            # alive before stay so: their heartbeats could not land (or expired) while it was away
            if time.monotonic() - self.link.recovered_at < self.dead_after_s:
                alive = {**known, **alive}
            return alive

        self.live = Liveness(
            workers=fresh(SERVICE_WORKER, before.workers),
            detoks=fresh(SERVICE_DETOK, before.detoks),
            routers=fresh(SERVICE_ROUTER, before.routers),
        )

    def _fail_orphans(self) -> None:
        """End requests that nothing alive will ever answer."""
        live = self.live
        failures = []
        for p in list(self.pending.values()):
            shard = live.detoks.get(p.detok)
            if not live.workers:
                why = "no worker is alive"
            elif shard is None or shard.started != p.detok_started:
                why = f"detokenizer {p.detok} died"
            else:
                continue
            failures.append((p, _error_item(p, why)))
        if failures:
            log.error("failing %d in-flight requests: %s", len(failures), failures[0][1].error)
            self._deliver(failures)


def _error_item(p: PendingRequest, why: str) -> TextItem:
    """The last item of a generation the front end ends itself."""
    return TextItem(
        p.rid, "", finish_reason=FINISH_ERROR, error=why, error_kind=ERR_FAILED, prompt_tokens=p.prompt_tokens
    )
