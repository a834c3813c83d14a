"""The worker's Redis threads against a real redis-server: the inbox delivers what was sent,
in order, read by the idle loop itself or by its thread while the loop is busy; the outbox
sends in order, and a message handed to an idle outbox is on its way before the step loop
goes on."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from services.worker.io_threads import Inbox, Outbox
from shared.busy_poll import BusyPoll
from shared.messages import AbortReqs
from shared.redis_link import RedisLink, client
from shared.redis_streams import StreamReader, StreamWriter
from tools.redis_server import free_port


class RecordingWriter(StreamWriter):
    """A real StreamWriter that also notes when each send began."""

    def __init__(self, link: RedisLink) -> None:
        super().__init__(link)
        self.started: list[float] = []

    def send_many(self, items, acks=(), once: bool = False) -> None:  # type: ignore[override]
        self.started.append(time.perf_counter())
        super().send_many(items, acks, once)


def _read_rids(reader: StreamReader, n: int) -> list[str]:
    """The first rid of each of the next n messages on the reader's stream, in order."""
    got: list[str] = []
    while len(got) < n:
        entries = reader.read(count=100, block_ms=1000)
        assert entries, f"messages were lost: {n - len(got)} never came"
        got += [e.msg.rids[0] for e in entries]
    return got


def _busy(seconds: float) -> None:
    """Python that holds the interpreter lock, as the step loop does between device waits."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_outbox_sends_in_order_and_starts_before_the_loop_goes_on(redis_url: str) -> None:
    link = RedisLink(redis_url)
    stop = threading.Event()
    writer = RecordingWriter(link)
    outbox = Outbox(writer, stop).start()
    reader = StreamReader(link, "t:outbox", "g", consumer="c")
    time.sleep(0.05)  # the thread is waiting for work
    handed = []
    for k in range(20):
        handed.append(time.perf_counter())
        outbox.send([("t:outbox", AbortReqs([f"r{k}"], "test"))])
        _busy(0.02)  # a step's worth of Python before the loop would wait for the device
    outbox.close()
    assert _read_rids(reader, 20) == [f"r{k}" for k in range(20)]
    # every send began while its step was still running, not when the busy loop let go of the lock
    delays = sorted(s - h for s, h in zip(writer.started, handed, strict=True))
    assert delays[len(delays) // 2] < 0.005, delays


def test_inbox_delivers_entries_and_waits_for_the_first(redis_url: str) -> None:
    link = RedisLink(redis_url)
    stop = threading.Event()
    inbox = Inbox(StreamReader(link, "t:inbox", "g", consumer="c"), stop).start()
    try:
        assert inbox.drain(wait_s=0.05) == []
        StreamWriter(link).send_many([("t:inbox", AbortReqs(["a"], "test")), ("t:inbox", AbortReqs(["b"], "test"))])
        got = inbox.drain(wait_s=2.0)
        while len(got) < 2:
            got += inbox.drain(wait_s=2.0)
        assert [e.msg.rids[0] for e in got] == ["a", "b"]
    finally:
        stop.set()


class NotingReader(StreamReader):
    """A real StreamReader that notes, for each read that returned entries, the thread and
    the BLOCK it read with."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.reads: list[tuple[str, int | None]] = []

    def read(self, count=256, block_ms=None, acks=(), once=False, **kw):  # type: ignore[override]
        out = super().read(count, block_ms, acks, once, **kw)
        if out:
            self.reads.append((threading.current_thread().name, block_ms))
        return out


@contextlib.contextmanager
def inbox_on(
    redis_url: str, stream: str, poll: BusyPoll | None = None
) -> Iterator[tuple[Inbox, NotingReader, StreamWriter]]:
    """A started inbox on a new stream, its noting reader and a writer to the stream; stopped after."""
    link = RedisLink(redis_url)
    stop = threading.Event()
    reader = NotingReader(link, stream, "g", consumer="c")
    inbox = Inbox(reader, stop, poll).start()
    try:
        yield inbox, reader, StreamWriter(link)
    finally:
        stop.set()


def test_an_idle_loop_reads_for_itself_and_a_busy_one_drains_what_the_thread_read(redis_url: str) -> None:
    """drain with a wait: the loop (idle) reads for itself, so an entry reaches it without a
    hand-off; with many requests the thread reads and queues; order holds across the change."""
    loop_thread = threading.current_thread().name
    with inbox_on(redis_url, "t:turn") as (inbox, reader, writer):
        delays = []
        for k in range(10):
            sent = threading.Timer(0.02, lambda k=k: writer.send("t:turn", AbortReqs([f"w{k}"], "test")))
            t = time.perf_counter()
            sent.start()
            got = inbox.drain(wait_s=2.0)
            delays.append(time.perf_counter() - t - 0.02)
            assert [e.msg.rids[0] for e in got] == [f"w{k}"]
        assert sorted(delays)[5] < 0.05, delays
        assert {name for name, _ in reader.reads} == {loop_thread}
        inbox.thread_reads(True)  # many requests: the thread reads, the loop only drains
        for k in range(5):
            writer.send("t:turn", AbortReqs([f"b{k}"], "test"))
        deadline = time.monotonic() + 5
        got = []
        while len(got) < 5 and time.monotonic() < deadline:
            got += inbox.drain()  # no wait: a loop with many requests never reads
            time.sleep(0.01)
        assert reader.reads[-1][0] == "inbox"
        # the loop takes the reading back while the thread may hold entries: they come first, in order
        inbox.thread_reads(False)
        writer.send_many([("t:turn", AbortReqs([f"c{k}"], "test")) for k in range(3)])
        while len(got) < 8 and time.monotonic() < deadline:
            got += inbox.drain(wait_s=0.5)
        assert [e.msg.rids[0] for e in got] == [f"b{k}" for k in range(5)] + [f"c{k}" for k in range(3)]


def test_with_few_requests_the_loop_reads_between_steps_without_waiting(redis_url: str) -> None:
    with inbox_on(redis_url, "t:few") as (inbox, reader, writer):
        inbox.thread_reads(False)
        assert inbox.drain() == []  # nothing yet, and no wait
        writer.send("t:few", AbortReqs(["f"], "test"))
        got: list = []
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = inbox.drain()
        assert [e.msg.rids[0] for e in got] == ["f"]
        assert reader.reads == [(threading.current_thread().name, None)]
        reader.link.quick = client(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.2)  # not at once
        writer.send("t:few", AbortReqs(["g"], "test"))
        got = inbox.drain()  # hands the reading to the thread instead of waiting
        while not got and time.monotonic() < deadline:
            got = inbox.drain()
            time.sleep(0.01)
        assert [e.msg.rids[0] for e in got] == ["g"] and reader.reads[-1][0] == "inbox"


def test_an_idle_loop_polls_inside_the_window(redis_url: str) -> None:
    poll = BusyPoll(5.0)
    with inbox_on(redis_url, "t:poll", poll) as (inbox, reader, writer):
        poll.note(True)  # work just ended: the window is open
        threading.Timer(0.02, lambda: writer.send("t:poll", AbortReqs(["p"], "test"))).start()
        assert [e.msg.rids[0] for e in inbox.drain(wait_s=2.0)] == ["p"]
        assert reader.reads == [(threading.current_thread().name, None)]  # read without BLOCK
        poll.window_s = 0.0  # no polling: a blocking read
        threading.Timer(0.02, lambda: writer.send("t:poll", AbortReqs(["q"], "test"))).start()
        assert [e.msg.rids[0] for e in inbox.drain(wait_s=2.0)] == ["q"]
        assert reader.reads[-1] == (threading.current_thread().name, 2000)


def test_a_small_job_for_an_idle_outbox_is_sent_by_the_caller_or_else_by_the_thread(redis_url: str) -> None:
    link = RedisLink(redis_url)
    stop = threading.Event()
    senders: list[str] = []  # the thread of each send that went through

    class Noting(StreamWriter):
        def send_many(self, items, acks=(), once: bool = False) -> None:  # type: ignore[override]
            super().send_many(items, acks, once)
            senders.append(threading.current_thread().name)

    outbox = Outbox(Noting(link), stop).start()
    reader = StreamReader(link, "t:once", "g", consumer="c")
    time.sleep(0.05)  # the thread is waiting for work
    outbox.send([("t:once", AbortReqs(["a"], "test"))], at_once=True)
    assert senders == [threading.current_thread().name]
    link.quick = client(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.2)  # "not at once"
    outbox.send([("t:once", AbortReqs(["b"], "test"))], at_once=True)
    outbox.send([("t:once", AbortReqs(["c"], "test"))], at_once=True)
    outbox.close()
    assert _read_rids(reader, 3) == ["a", "b", "c"]
    # b was tried at once and failed, then sent by the thread; so was c (tried at once too when
    # the thread was idle again by then, or handed to it straight away)
    assert senders == [threading.current_thread().name, "outbox", "outbox"], senders
