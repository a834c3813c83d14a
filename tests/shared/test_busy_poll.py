"""Busy polling (shared/busy_poll.py) against a real redis-server: when a reader polls, that a
polled read returns what a blocking one would, and the window's end."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from shared.busy_poll import AUTO_MIN_CPUS, DEFAULT_WINDOW_MS, BusyPoll, window_s
from shared.messages import AbortReq
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter


class BlocksNoted(StreamReader):
    """A real reader that notes the BLOCK of every read."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.blocks: list[int | None] = []
        self.spins: list[bool] = []

    def read(self, count=256, block_ms=None, acks=(), **kw):  # type: ignore[override]
        self.blocks.append(block_ms)
        self.spins.append(kw.get("spin", False))
        return super().read(count, block_ms, acks, **kw)


@pytest.mark.parametrize(
    ("setting", "cpus", "expected"),
    [(-1, AUTO_MIN_CPUS, DEFAULT_WINDOW_MS / 1000), (-1, AUTO_MIN_CPUS - 1, 0.0), (0, 64, 0.0), (50, 2, 0.05)],
)
def test_the_window_for_a_setting_and_a_host(setting: float, cpus: int, expected: float) -> None:
    assert window_s(setting, cpus) == pytest.approx(expected)


def test_polling_while_busy_and_for_the_window_after() -> None:
    now = [100.0]
    poll = BusyPoll(0.2, clock=lambda: now[0])
    assert not poll.polling()  # nothing was in flight yet
    poll.note(True)
    now[0] += 0.1
    poll.note(False)
    assert poll.polling()
    now[0] += 0.15  # 0.25 s after the last busy note
    assert not poll.polling()
    off = BusyPoll(0.0, clock=lambda: now[0])
    off.note(True)
    assert not off.polling()


def read_a_late_entry(
    redis_url: str, stream: str, poll: BusyPoll, after_s: float, spins: list[bool] | None = None
) -> tuple[list[str], list]:
    """poll.read with a 2 s wait on a new stream, whose one entry is sent after_s later: the rids
    read and the BLOCK of every read made (and in ``spins``, whether each spun)."""
    link = RedisLink(redis_url)
    reader = BlocksNoted(link, stream, "g", "c")
    threading.Timer(after_s, lambda: StreamWriter(link).send(stream, AbortReq("late", ""))).start()
    got = poll.read(reader, count=10, block_ms=2000)
    if spins is not None:
        spins += reader.spins
    return [e.msg.rid for e in got], reader.blocks


def test_outside_the_window_a_read_blocks(redis_url: str) -> None:
    assert read_a_late_entry(redis_url, "bp:block", BusyPoll(1.0), 0.05) == (["late"], [2000])


def test_inside_the_window_a_read_polls_until_an_entry_comes(redis_url: str) -> None:
    poll = BusyPoll(5.0)
    poll.note(True)
    rids, blocks = read_a_late_entry(redis_url, "bp:poll", poll, 0.05)
    assert rids == ["late"]
    assert len(blocks) > 1 and set(blocks) == {None}  # polled, never blocked
    reader = StreamReader(RedisLink(redis_url), "bp:poll", "g", "c")
    t = time.perf_counter()
    assert poll.read(reader, count=10, block_ms=30) == []  # nothing comes: back after the wait
    assert 0.03 <= time.perf_counter() - t < 1.0


def test_a_spinning_poll_makes_its_polling_reads_spin_and_its_blocking_read_not(redis_url: str) -> None:
    poll = BusyPoll(0.05, spin=True)
    poll.note(True)
    spins: list[bool] = []
    rids, blocks = read_a_late_entry(redis_url, "bp:spin", poll, 0.3, spins)
    assert rids == ["late"]
    assert [s for s, b in zip(spins, blocks, strict=True) if b is None] == [True] * (len(blocks) - 1)
    assert blocks[-1] is not None and spins[-1] is False  # after the window: redis-py's blocking read


def test_a_window_that_closes_mid_wait_leaves_the_rest_to_a_blocking_read(redis_url: str) -> None:
    poll = BusyPoll(0.05)
    poll.note(True)
    rids, blocks = read_a_late_entry(redis_url, "bp:close", poll, 0.3)
    assert rids == ["late"]
    assert blocks[0] is None and blocks[-1] is not None and 1000 < blocks[-1] < 2000


def test_outside_the_window_a_wait_shorter_than_redis_can_time_is_polled(redis_url: str) -> None:
    reader = BlocksNoted(RedisLink(redis_url), "bp:short", "g", "c")
    gc.disable()  # a full collection with torch loaded takes 100-150 ms, longer than the bound below
    try:
        t = time.perf_counter()
        assert BusyPoll(0.0).read(reader, count=10, block_ms=20) == []
        took = time.perf_counter() - t
    finally:
        gc.enable()
    assert 0.02 <= took < 0.09  # a BLOCK of 20 would last up to 100 ms
    assert set(reader.blocks) == {None}


def test_a_read_acknowledges_in_the_same_round_trip(redis_url: str) -> None:
    link = RedisLink(redis_url)
    reader = StreamReader(link, "bp:acks", "g", "c")
    StreamWriter(link).send_many([("bp:acks", AbortReq(r, "")) for r in "ab"])
    got = reader.read(block_ms=100)
    assert reader.pending_count() == 2
    assert reader.read(block_ms=None, acks=got) == []
    assert reader.pending_count() == 0


def test_a_quick_read_makes_a_lost_group_again(redis_url: str) -> None:
    """The worker's read between steps (once) after Redis lost the group (a restart without
    persistence): the group is made again and the entries sent since are read."""
    link = RedisLink(redis_url)
    reader = StreamReader(link, "bp:lost", "g", "c")
    link.client.delete("bp:lost")  # the stream and its group are gone
    StreamWriter(link).send("bp:lost", AbortReq("after", ""))
    assert [e.msg.rid for e in reader.read(block_ms=None, once=True)] == ["after"]
