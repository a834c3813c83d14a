"""Streams trimmed by what every consumer group has consumed (shared/stream_trim.py), against a
real redis-server: what a group still needs stays, the rest goes, through a reader's reads too."""

from __future__ import annotations

import redis

from shared.messages import AbortReq
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.stream_trim import trim_consumed


def _ids(r: redis.Redis, stream: str) -> list[bytes]:
    return [entry_id for entry_id, _ in r.xrange(stream)]


def test_only_what_every_group_has_consumed_is_trimmed(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    ids = [r.xadd("s", {"m": b"x" * 1000}) for _ in range(10)]
    assert trim_consumed(r, "s") == -1 and r.xlen("s") == 10  # no reader yet: all wait for it
    r.xgroup_create("s", "fast", id="0")
    r.xgroup_create("s", "slow", id="0")
    r.xreadgroup("fast", "c", {"s": ">"})
    r.xack("s", "fast", *ids)
    assert trim_consumed(r, "s") == 0  # "slow" has read nothing
    r.xreadgroup("slow", "c", {"s": ">"}, count=6)
    r.xack("s", "slow", *ids[:3])
    assert trim_consumed(r, "s") == 3 and _ids(r, "s") == ids[3:]  # ids[3..5] still pending there
    r.xack("s", "slow", *ids[3:6])
    assert trim_consumed(r, "s") == 2 and _ids(r, "s") == ids[5:]  # the last one handed out stays
    assert 0 < r.pttl("s") <= 3_600_000  # readers keep it alive; with none left, it goes


def test_a_reader_trims_its_stream_as_it_reads(redis_url: str) -> None:
    link = RedisLink(redis_url)
    writer = StreamWriter(link)
    reader = StreamReader(link, "s", "g", "c", trim_every_s=0.0)
    for k in range(50):
        writer.send("s", AbortReq(f"r{k}", "x" * 10_000))
    writer.send_many([], acks=reader.read(count=100, block_ms=100))
    reader.read(block_ms=10)  # trims first: everything but the last entry handed out
    assert redis.Redis.from_url(redis_url).xlen("s") == 1
