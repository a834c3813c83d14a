"""shared/loop_read.py against a real redis-server: the loop's own polls read as StreamReader's
reads do (acknowledgements, the lease, the database in the URL), give up after their wait, and
answer None (the caller's thread reads) when the connection or the group is gone. A lost
answer's entries: tests/tokenizer/test_pipeline_replies.py."""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis

from shared import loop_read
from shared.loop_read import LoopReader
from shared.messages import AbortReq
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from tools.redis_server import RedisServer


def test_polls_read_acknowledge_and_keep_the_lease(redis_url: str) -> None:
    link = RedisLink(redis_url)
    reader = StreamReader(link, "lr", "g", "c1")
    polls = LoopReader(reader)

    async def run() -> None:
        assert await polls.read(16, [], 0.05) == []  # nothing pending, then nothing new in 50 ms
        StreamWriter(link).send_many([("lr", AbortReq("a", "x")), ("lr", AbortReq("b", "y"))])
        got = await polls.read(1, [], 1.0)
        assert [e.msg.rid for e in got] == ["a"]
        assert reader.pending_count() == 1
        later = asyncio.get_running_loop().call_later(0.05, StreamWriter(link).send, "lr", AbortReq("c", "z"))
        got2 = await polls.read(16, got, 1.0)  # "a" acknowledged in the first poll's round trip
        assert [e.msg.rid for e in got2] == ["b"]
        got3 = await polls.read(16, got2, 1.0)  # "c" comes 50 ms later, to a poll that waited for it
        assert [e.msg.rid for e in got3] == ["c"]
        later.cancel()
        assert await polls.read(16, got3, 0.0) == []
        assert reader.pending_count() == 0
        polls.close()

    asyncio.run(asyncio.wait_for(run(), 10))
    assert redis.Redis.from_url(redis_url).pttl(reader.lease) > 0


def test_the_database_in_the_url_is_selected(redis_server: RedisServer) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/4"
    link = RedisLink(url)
    reader = StreamReader(link, "in-four", "g", "c1")
    StreamWriter(link).send("in-four", AbortReq("a", "x"))

    async def run() -> list:
        polls = LoopReader(reader)
        try:
            return await polls.read(16, [], 1.0)
        finally:
            polls.close()

    assert [e.msg.rid for e in asyncio.run(run())] == ["a"]
    assert redis.Redis.from_url(redis_server.url).exists("in-four") == 0


def test_a_lost_group_or_a_lost_redis_answers_none_and_is_not_tried_again_at_once(monkeypatch) -> None:
    monkeypatch.setattr(loop_read, "RETRY_S", 0.3)
    server = RedisServer().start()
    link = RedisLink(server.url)
    reader = StreamReader(link, "gone", "g", "c1")
    polls = LoopReader(reader)

    async def run() -> None:
        assert await polls.read(16, [], 0.0) == []
        redis.Redis.from_url(server.url).delete("gone")  # the stream and its group with it
        assert await polls.read(16, [], 0.5) is None  # NOGROUP: the caller's read recreates the group
        assert await polls.read(16, [], 0.5) is None  # not tried again before RETRY_S
        reader.ensure_group()
        await asyncio.sleep(0.35)
        assert await polls.read(16, [], 0.0) == []
        server.stop()
        started = time.monotonic()
        assert await polls.read(16, [], 5.0) is None  # the connection lost, at once rather than after the wait
        assert time.monotonic() - started < 2.0
        await asyncio.sleep(0.35)
        assert await polls.read(16, [], 0.0) is None  # refused
        polls.close()

    try:
        asyncio.run(asyncio.wait_for(run(), 20))
    finally:
        server.stop()


def test_a_cancelled_read_loses_nothing(redis_url: str) -> None:
    """A read cancelled while its poll is in flight closes the connection; the next read's
    first poll, on a new one, reads the consumer's pending entries: nothing that poll took
    is lost, nor taken for another poll's answer."""
    link = RedisLink(redis_url)
    reader = StreamReader(link, "cancel", "g", "c1")
    polls = LoopReader(reader)

    async def run() -> list[str]:
        assert await polls.read(16, [], 0.0) == []
        task = asyncio.ensure_future(polls.read(16, [], 5.0))
        await asyncio.sleep(0.05)  # polling
        StreamWriter(link).send("cancel", AbortReq("a", "x"))  # perhaps taken by the cancelled read's last poll
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            return [e.msg.rid for e in await task]  # it had "a" before the cancel took
        got = await polls.read(16, [], 1.0)
        got += await polls.read(16, got, 0.2)
        polls.close()
        return [e.msg.rid for e in got]

    assert asyncio.run(asyncio.wait_for(run(), 10)) == ["a"]


def test_a_password_is_sent_and_a_wrong_one_answers_none() -> None:
    with RedisServer() as server:
        redis.Redis.from_url(server.url).config_set("requirepass", "s3cret")
        host_port = server.url.split("//", 1)[1]
        good = RedisLink(f"redis://:s3cret@{host_port}")
        StreamWriter(good).send("auth", AbortReq("a", "x"))
        reader = StreamReader(good, "auth", "g", "c1")
        assert [e.msg.rid for e in asyncio.run(LoopReader(reader).read(16, [], 0.5))] == ["a"]
        reader.link = RedisLink(f"redis://:nope@{host_port}")  # the loop's connection takes the link's password
        assert asyncio.run(LoopReader(reader).read(16, [], 0.5)) is None
