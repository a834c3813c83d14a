"""A dead detokenizer shard's stream taken over (services/detokenizer/adoption.py), against a
real redis-server: by another shard, or by the same one restarted. The open requests' sessions
are made again from their registrations and the tokens acknowledged after them, and go on;
every piece of text reaches the front end exactly once."""

from __future__ import annotations

import time
import uuid

from shared.messages import TokenBatch, TokenItem
from shared.redis_link import RedisLink
from shared.redis_streams import StreamWriter
from shared.streams import StreamNames
from tests.detokenizer.test_drain import register, shard, texts


def _died_mid_batch(link: RedisLink, names: StreamNames) -> StreamWriter:
    """d0 served "ab" of r1, then read "cd" and died before it sent their text."""
    writer = StreamWriter(link)
    d0 = shard(link, names, "d0")
    stream = names.detok("d0")
    register(writer, names)
    writer.send(stream, TokenBatch("worker:0", [TokenItem("r1", [0, 1], output_tokens=2)]))
    d0.handle(d0.reader.read(count=10, block_ms=100))
    writer.send(stream, TokenBatch("worker:0", [TokenItem("r1", [2, 3], output_tokens=4)]))
    assert len(d0.reader.read(count=10, block_ms=100)) == 1  # read, never handled: the shard dies here
    d0.own.owner.release()  # as its key's expiry would, 5 s on
    return writer


def _finish(writer: StreamWriter, names: StreamNames) -> None:
    item = TokenItem("r1", [4], finish_reason="length", output_tokens=5)
    writer.send(names.detok("d0"), TokenBatch("worker:0", [item]))


def test_another_shard_takes_a_dead_shards_requests_over(redis_url: str) -> None:
    link, names = RedisLink(redis_url), StreamNames("t" + uuid.uuid4().hex[:8])
    writer = _died_mid_batch(link, names)
    d1 = shard(link, names, "d1")
    held, taken = d1.adoptions.look(d1.own)
    assert held and [s.shard for s in taken] == ["d0"]
    d1._restore(taken[0])
    assert d1.adoptions.look(d1.own) == (True, [])  # taken once
    _finish(writer, names)
    end = time.monotonic() + 5
    while d1.sessions and time.monotonic() < end:
        d1.handle(d1.adoptions.taken["d0"].reader.read(count=10, block_ms=100))
    got = texts(link, names)
    assert [t.text for t in got] == ["ab", "cd", "e"] and got[-1].finish_reason == "length"
    beats = link.client.keys(names.heartbeat("detokenizer", "d0"))
    assert beats  # front ends see d0's requests served meanwhile
    d1.adoptions.give_back({})
    assert not d1.adoptions.taken and not link.client.keys(names.heartbeat("detokenizer", "d0"))


def test_a_restarted_shard_takes_its_own_requests_back(redis_url: str) -> None:
    link, names = RedisLink(redis_url), StreamNames("t" + uuid.uuid4().hex[:8])
    writer = _died_mid_batch(link, names)
    again = shard(link, names, "d0")  # the same name, a new process: takes its stream over
    _finish(writer, names)
    again.handle(again.reader.read(count=10, block_ms=100))
    assert [t.text for t in texts(link, names)] == ["ab", "cd", "e"]
    assert not again.sessions and again.reader.pending_count() == 0
