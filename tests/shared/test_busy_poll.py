"""Busy polling (shared/busy_poll.py) against a real redis-server: when a reader polls, that a
polled read returns what a blocking one would, and the window's end."""

from __future__ import annotations

import asyncio
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

    def read(self, count=256, block_ms=None, acks=()):  # type: ignore[override]
        self.blocks.append(block_ms)
        return super().read(count, block_ms, acks)

    async def aread(self, count=256, block_ms=None, acks=()):  # type: ignore[override]
        self.blocks.append(block_ms)
        return await super().aread(count, block_ms, acks)


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


def read_a_late_entry(redis_url: str, stream: str, poll: BusyPoll, after_s: float, how: str = "sync") -> tuple:
    """poll.read (or with ``how`` "async", poll.aread) with a 2 s wait on a new stream, whose one
    entry is sent after_s later: the rids read and the BLOCK of every read made."""
    link = RedisLink(redis_url)
    reader = BlocksNoted(link, stream, "g", "c")
    threading.Timer(after_s, lambda: StreamWriter(link).send(stream, AbortReq("late", ""))).start()
    if how == "sync":
        got = poll.read(reader, count=10, wait_ms=2000)
    else:

        async def aread() -> list:
            try:
                return await poll.aread(reader, count=10, wait_ms=2000)
            finally:
                await reader.aclose()

        got = asyncio.run(aread())
    return [e.msg.rid for e in got], reader.blocks


@pytest.mark.parametrize("how", ["sync", "async"])
def test_outside_the_window_a_read_blocks(redis_url: str, how: str) -> None:
    assert read_a_late_entry(redis_url, f"bp:block:{how}", BusyPoll(1.0), 0.05, how) == (["late"], [2000])


@pytest.mark.parametrize("how", ["sync", "async"])
def test_inside_the_window_a_read_polls_until_an_entry_comes(redis_url: str, how: str) -> None:
    poll = BusyPoll(5.0)
    poll.note(True)
    rids, blocks = read_a_late_entry(redis_url, f"bp:poll:{how}", poll, 0.05, how)
    assert rids == ["late"]
    assert len(blocks) > 1 and set(blocks) == {None}  # polled, never blocked
    reader = StreamReader(RedisLink(redis_url), "bp:poll", "g", "c")
    t = time.perf_counter()
    assert poll.read(reader, count=10, wait_ms=30) == []  # nothing comes: back after the wait
    assert 0.03 <= time.perf_counter() - t < 1.0


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
        assert BusyPoll(0.0).read(reader, count=10, wait_ms=20) == []
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
    assert reader.read(acks=got) == []
    assert reader.pending_count() == 0


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_read_that_does_not_wait_makes_a_lost_group_again(redis_url: str, how: str) -> None:
    """After Redis lost the group (a restart without persistence) the group is made again and
    the entries sent since are read."""
    link = RedisLink(redis_url)
    reader = StreamReader(link, f"bp:lost:{how}", "g", "c")
    link.client.delete(f"bp:lost:{how}")  # the stream and its group are gone
    StreamWriter(link).send(f"bp:lost:{how}", AbortReq("after", ""))

    async def aread() -> list:
        try:
            return await reader.aread()
        finally:
            await reader.aclose()

    got = reader.read() if how == "sync" else asyncio.run(aread())
    assert [e.msg.rid for e in got] == ["after"]
