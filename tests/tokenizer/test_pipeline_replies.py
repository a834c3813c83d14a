"""The front end's replies against a real redis-server: a request's items reach its queue in
order and are acknowledged, read by blocking reads or, while requests are in flight and the
window is open, by polls; and a read whose answer is lost costs nothing."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from services.tokenizer.pipeline import Liveness, Pipeline
from shared.busy_poll import BusyPoll
from shared.messages import Heartbeat, SamplingParams, TextBatch, TextItem
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import GROUP_FRONT, StreamNames
from tests.shared.answer_cutter import AnswerCutter
from tools.redis_server import RedisServer


class ReadsNoted(StreamReader):
    """The pipeline's real reader, noting the BLOCK of each read that returned entries and when
    each read began."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.reads: list[int | None] = []
        self.starts: list[float] = []  # time.monotonic() at the start of every read

    async def aread(self, count=256, block_ms=None, acks=()):  # type: ignore[override]
        self.starts.append(time.monotonic())
        out = await super().aread(count, block_ms, acks)
        if out:
            self.reads.append(block_ms)
        return out


def beat(service: str, replica: str) -> Heartbeat:
    return Heartbeat(service, replica, 1, time.time(), time.time(), {})


def pipeline(link: RedisLink, namespace: str, poll: BusyPoll, check_s: float = 1.0) -> Pipeline:
    p = Pipeline(link, StreamNames(namespace), "front-0", maxlen=1000, dead_after_s=3.0, check_s=check_s, poll=poll)
    p.reader = ReadsNoted(link, p.names.front("front-0"), GROUP_FRONT, consumer="front-0")
    return p


async def submitted(p: Pipeline) -> asyncio.Queue[tuple[int, TextItem]]:
    """Start the pipeline with every service alive and submit request r0; its queue."""
    p.start(asyncio.get_running_loop())
    p.live = Liveness(
        workers={"w": beat("worker", "w")}, detoks={"d0": beat("detokenizer", "d0")}, routers={"r": beat("router", "r")}
    )
    queue: asyncio.Queue[tuple[int, TextItem]] = asyncio.Queue()
    await p.submit("r0", [1, 2, 3], SamplingParams(), [], True, time.time() + 60, queue, 0)
    return queue


def detokenize(p: Pipeline, texts: list[str], gap_s: float) -> None:
    """Write an item of r0 for each text to the front end's stream, as a detokenizer would, from a thread."""
    writer = StreamWriter(p.link)
    front = p.names.front("front-0")

    def run() -> None:
        for text in texts:
            writer.send(front, TextBatch([TextItem("r0", text)]))
            time.sleep(gap_s)

    threading.Thread(target=run).start()


async def stream_of(p: Pipeline, n: int) -> list[str]:
    """Submit one request, write n items for it as a detokenizer would, return the texts its queue got."""
    queue = await submitted(p)
    detokenize(p, [f"t{k}" for k in range(n)], 0.002)
    got = [(await asyncio.wait_for(queue.get(), 5))[1].text for _ in range(n)]
    deadline = time.monotonic() + 5
    while p.reader.pending_count() and time.monotonic() < deadline:  # acknowledged with the next read
        await asyncio.sleep(0.05)
    assert p.reader.pending_count() == 0
    p.stop()
    return got


@pytest.mark.parametrize("window_s", [0.0, 5.0])
def test_items_arrive_in_order_and_are_acknowledged(redis_url: str, window_s: float) -> None:
    link = RedisLink(redis_url)
    p = pipeline(link, f"rep{int(window_s)}", BusyPoll(window_s))
    assert asyncio.run(stream_of(p, 30)) == [f"t{k}" for k in range(30)]
    # a request in flight and the window open: every read is a poll, else each one blocks
    assert set(p.reader.reads) == ({None} if window_s else {500})


@pytest.mark.parametrize("window_s", [0.0, 5.0])
def test_a_read_whose_answer_is_lost_costs_nothing(redis_server: RedisServer, redis_url: str, window_s: float) -> None:
    """Redis serves a read of the replies but its answer never arrives (the connection is cut):
    the next read, after a pause, recovers what it took (StreamReader's rule), in order."""
    cutter = AnswerCutter("127.0.0.1", redis_server.port)
    link = RedisLink(cutter.url)
    p = pipeline(link, f"cut{int(window_s)}", BusyPoll(window_s), check_s=60.0)  # the liveness set here stays

    async def run() -> list[str]:
        queue = await submitted(p)
        detokenize(p, ["a", "b"], 0.002)
        got = [(await asyncio.wait_for(queue.get(), 5))[1].text for _ in range(2)]
        cutter.cut_next_answer_with(b"lost-c")
        detokenize(p, ["lost-c", "d"], 0.002)
        got += [(await asyncio.wait_for(queue.get(), 5))[1].text for _ in range(2)]
        p.stop()
        return got

    try:
        got = asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        cutter.close()
    assert cutter.cuts == 1
    assert got == ["a", "b", "lost-c", "d"]


def test_a_lone_requests_task_runs_to_its_chunk_before_the_next_read(redis_url: str) -> None:
    """With few requests in flight, the next read (a polling one here) is not asked for until
    the task that an item woke has run its step, so the reads thread does not take the
    interpreter lock from the task as it writes its chunk."""
    link = RedisLink(redis_url)
    p = pipeline(link, "turn", BusyPoll(5.0))

    async def run() -> list[tuple[float, float]]:
        queue = await submitted(p)
        detokenize(p, ["a", "b", "c"], 0.05)
        steps = []
        for _ in range(3):
            await queue.get()  # as the routes wait (fanout.merged): woken in the turn after the hand-out
            got = time.monotonic()
            while time.monotonic() - got < 0.02:  # the step's own work, holding the lock: 20 ms of Python
                pass
            steps.append((got, time.monotonic()))
        p.stop()
        return steps

    steps = asyncio.run(asyncio.wait_for(run(), 10))
    assert len(p.reader.starts) > 10  # it polled
    for got, done in steps:
        assert not [t for t in p.reader.starts if got < t < done], "a read began while the task ran"


def test_a_text_item_sent_twice_reaches_the_request_once(redis_url: str) -> None:
    """A detokenizer whose send was retried after Redis's answer was lost writes its batch twice:
    the copy (an output count the request has reached) is dropped; items without tokens, whose
    count does not move, go through."""
    link = RedisLink(redis_url)
    p = pipeline(link, "twice", BusyPoll(0.0))
    writer = StreamWriter(link)
    front = p.names.front("front-0")

    async def run() -> list[tuple[str, int, str]]:
        queue = await submitted(p)
        items = [TextItem("r0", "ab", [97, 98], output_tokens=2), TextItem("r0", "c", [99], output_tokens=3)]
        for item in (items[0], items[0], items[1], items[0], TextItem("r0", "", finish_reason="length")):
            writer.send(front, TextBatch([item]))
        got = [(await asyncio.wait_for(queue.get(), 5))[1] for _ in range(3)]
        await asyncio.sleep(0.3)
        assert queue.empty()
        p.stop()
        return [(i.text, i.output_tokens, i.finish_reason) for i in got]

    assert asyncio.run(run()) == [("ab", 2, ""), ("c", 3, ""), ("", 0, "length")]
