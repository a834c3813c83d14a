"""The front end's side of the pipeline: submit requests, receive their text, watch health.

Submitting registers the request with a detokenizer shard and then sends it to the
router (in that order, in one round trip, so the shard knows it before any token can
arrive). A task on the event loop reads TextBatch messages from this front end's stream
and puts each item, tagged with its generation's index, on the asyncio queue of the HTTP
request waiting for it (one queue for all the generations of a request). The reads are
asynchronous (StreamReader.aread, redis.asyncio): polls while requests are in flight and a
while after (shared/busy_poll.py), else blocking reads. A watchdog thread (watchdog.py) reads
who is alive, Redis included, and ends the requests in flight that nothing alive will answer;
aborts that cannot reach Redis are sent again once it answers.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
import zlib
from dataclasses import dataclass

from services.tokenizer.errors import APIError
from services.tokenizer.images.front import PromptImages
from services.tokenizer.watchdog import Liveness, Watchdog
from shared.busy_poll import BusyPoll
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
    VisualReq,
)
from shared.redis_link import TRANSIENT, NotAtOnce, RedisLink, RedisUnreachable, Stopping
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.streams import GROUP_FRONT, StreamNames

log = logging.getLogger(__name__)

READ_WAIT_MS = 500  # the longest one read of the replies waits
READ_RETRY_S = 0.5  # after a failed read of the replies (Redis away), the next one waits this long
AT_ONCE_MAX_PENDING = 4  # generations in flight (this one included) up to which a submission is sent from the loop
UNSENT_ABORTS_MAX = 100_000  # aborts kept while Redis is away, to send once it answers


class Unavailable(Exception):
    """The pipeline cannot take a request now (no worker, detokenizer or router alive, or the queue is full)."""


@dataclass
class PendingRequest:
    rid: str
    detok: str
    prompt_tokens: int
    queue: asyncio.Queue[tuple[int, TextItem]]  # shared by the generations of one HTTP request
    index: int  # this generation's index among its request's, the tag of its items in the queue
    finished: bool = False
    answered: bool = False  # an item has come: the request is past the router
    images: bool = False  # it went to the visual service first
    output_tokens: int = 0  # the count its items with tokens have reached


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
        router_dead_after_s: float = 8.0,
    ) -> None:
        self.link = link
        self.names = names
        self.front_id = front_id
        self.check_s = check_s
        self.writer = StreamWriter(link, maxlen)
        self.reader = StreamReader(link, names.front(front_id), GROUP_FRONT, consumer=front_id)
        self.pending: dict[str, PendingRequest] = {}
        self.watchdog = Watchdog(link, names, dead_after_s, router_dead_after_s)
        self._unsent: collections.deque[AbortReq] = collections.deque(maxlen=UNSENT_ABORTS_MAX)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.poll = poll or BusyPoll(0.0)
        self._io = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="redis-io")
        self._watchdog = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._tasks: list[asyncio.Task[None]] = []

    # ---------------------------------------------------------------- lifecycle

    @property
    def live(self) -> Liveness:
        return self.watchdog.live

    @live.setter
    def live(self, live: Liveness) -> None:
        self.watchdog.live = live

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.watchdog.refresh(time.time())
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
        images: PromptImages | None = None,
    ) -> PendingRequest:
        """A request with images goes to the visual service, which passes it on to the router
        once their embeddings are in Redis; one without goes to the router."""
        if not self.live.redis:
            raise Unavailable("redis is unreachable")
        if not self.live.workers:
            raise Unavailable("no worker is alive")
        if not self.live.routers:
            raise Unavailable("the router is not alive")
        if images is not None and not self.live.visuals:
            raise Unavailable("no visual replica is alive (the model's images are encoded there)")
        self._refuse_early(len(input_ids) + params.max_new_tokens)
        shard = self._pick_detok(rid)
        pending = PendingRequest(rid, shard.replica, len(input_ids), queue, index, images=bool(images))
        self.pending[rid] = pending
        register = DetokRegister(rid, self.front_id, len(input_ids), stop, skip_special_tokens, deadline)
        refs = images.refs if images is not None else []
        gen = GenerateReq(rid, self.front_id, shard.replica, input_ids, params, time.time(), deadline, images=refs)
        to = (self.names.router, gen) if images is None else (self.names.visual, VisualReq(gen, images.data))
        items = [(self.names.detok(shard.replica), register), to]
        try:
            if not self._sent_at_once(items):
                await asyncio.get_running_loop().run_in_executor(self._io, self._send_or_give_up, items)
        except RedisUnreachable as e:
            self.pending.pop(rid, None)
            raise Unavailable("redis is unreachable") from e
        except BaseException:
            self.pending.pop(rid, None)
            raise
        return pending

    def _send_or_give_up(self, items: list[tuple[str, object]]) -> None:
        """Send with retries, until the watchdog finds Redis away for too long (RedisUnreachable)."""
        self.writer.send_many(items, give_up=lambda: self.watchdog.redis_lost(time.time()))

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
        self._io.submit(self._send_aborts, [AbortReq(rid, reason)])

    def _send_aborts(self, aborts: list[AbortReq]) -> None:
        """From the I/O pool. While Redis is away they are kept, to be sent once it answers
        (a request queued or running when it went away would otherwise run on for nothing)."""
        try:
            self._send_or_give_up([(self.names.router, a) for a in aborts])
        except RedisUnreachable:
            self._unsent.extend(aborts)

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
        """A live shard by the request id's hash; one draining (shutting down) only when all are."""
        serving = [name for name, hb in self.live.detoks.items() if not hb.info.get("draining")]
        shards = sorted(serving or self.live.detoks)
        if not shards:
            raise Unavailable("no detokenizer is alive")
        return self.live.detoks[shards[zlib.crc32(rid.encode()) % len(shards)]]

    # ---------------------------------------------------------------- threads

    async def _read_replies(self) -> None:
        """Reads one at a time, so each request's items keep their order; a read's entries are
        acknowledged in the next read's round trip. A failed read's acknowledgements go with the
        next one, which also recovers what the failed one may have taken."""
        acks: list[Entry] = []
        failing = False  # said once per run of failed reads
        try:
            while not self.link.stop.is_set():
                self.poll.note(bool(self.pending))
                try:
                    entries = await self.poll.aread(self.reader, 256, READ_WAIT_MS, acks)
                except TRANSIENT as e:  # Redis away or slow
                    if not failing:
                        log.warning("reading replies failed (%s: %s); retrying", type(e).__name__, e)
                    failing = True
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                except Exception:
                    log.exception("reading replies failed; retrying")
                    await asyncio.sleep(READ_RETRY_S)
                    continue
                failing = False
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
                    if pending is None:
                        continue
                    if item.token_ids and item.output_tokens <= pending.output_tokens:
                        # text this request has had: a detokenizer's send retried after Redis's
                        # answer was lost (its output count never goes back otherwise)
                        log.warning("a text item came twice; dropped", extra={"rid": item.rid})
                        continue
                    pending.output_tokens = max(pending.output_tokens, item.output_tokens)
                    pending.answered = True
                    pending.queue.put_nowait((pending.index, item))

    def _fail(self, failures: list[tuple[PendingRequest, str]]) -> None:
        """From another thread (the watchdog): each request's last item, an error, and its abort."""

        def on_loop() -> None:
            for pending, why in failures:
                if self.pending.get(pending.rid) is pending:
                    pending.queue.put_nowait((pending.index, _error_item(pending, why)))
                    self.abort(pending.rid, why)

        assert self.loop is not None
        self.loop.call_soon_threadsafe(on_loop)

    def _watch(self) -> None:
        while not self.link.stop.wait(self.check_s):
            try:
                self.check(time.time())
            except Stopping:
                return
            except Exception:
                log.exception("health check failed")

    def check(self, now: float) -> None:
        """Who is alive; end the requests nothing alive will answer; once Redis answers again
        after it was away, send the aborts kept meanwhile."""
        if self.watchdog.refresh(now) and self._unsent:
            aborts = [self._unsent.popleft() for _ in range(len(self._unsent))]
            log.warning("sending %d aborts kept while redis was away", len(aborts))
            self._io.submit(self._send_aborts, aborts)
        failures = self.watchdog.orphans(list(self.pending.values()), now)
        if failures:
            log.error("failing %d in-flight requests: %s", len(failures), failures[0][1])
            self._fail(failures)


def _error_item(p: PendingRequest, why: str) -> TextItem:
    """The last item of a generation the front end ends itself."""
    return TextItem(
        p.rid, "", finish_reason=FINISH_ERROR, error=why, error_kind=ERR_FAILED, prompt_tokens=p.prompt_tokens
    )
