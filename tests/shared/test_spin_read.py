"""shared/spin_read.py and StreamReader's spinning reads against a real redis-server (a restart
under spinning reads: test_redis_streams.py)."""

from __future__ import annotations

import time

import pytest
import redis

from shared.messages import AbortReq
from shared.redis_link import NotAtOnce, RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.spin_read import SpinConnection, pack
from tools.redis_server import RedisServer


def test_pack_is_resp_arrays_of_bulk_strings() -> None:
    assert pack([("PING",), ("SET", "k", b"v\r\n", 5)]) == (
        b"*1\r\n$4\r\nPING\r\n*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$1\r\n5\r\n"
    )


def test_answers_come_in_order_and_an_error_answer_leaves_the_connection_usable(redis_url: str) -> None:
    conn = SpinConnection(RedisLink(redis_url).client.connection_pool.connection_kwargs)
    assert conn.execute([("SET", "k", "v"), ("GET", "k"), ("PING",)]) == [b"OK", b"v", b"PONG"]
    with pytest.raises(redis.ResponseError, match="unknown command"):
        conn.execute([("GET", "k"), ("NO-SUCH-COMMAND",)])
    assert conn.execute([("GET", "k")]) == [b"v"]
    big = b"x" * 300_000  # an answer in many recv()s
    conn.execute([("SET", "big", big)])
    assert conn.execute([("GET", "big")]) == [big]
    conn.close()


def test_the_database_in_the_url_is_selected(redis_server: RedisServer) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    conn = SpinConnection(RedisLink(url).client.connection_pool.connection_kwargs)
    conn.execute([("SET", "in-three", "1")])
    assert redis.Redis.from_url(url).get("in-three") == b"1"
    assert redis.Redis.from_url(redis_server.url).get("in-three") is None


def test_a_spinning_read_is_the_read_redis_py_makes(redis_url: str) -> None:
    link = RedisLink(redis_url)
    reader = StreamReader(link, "s", "g", "c1")
    writer = StreamWriter(link)
    assert reader.read(spin=True) == []
    writer.send_many([("s", AbortReq("a", "x")), ("s", AbortReq("b", "y"))])
    got = reader.read(count=1, spin=True)
    assert [e.msg.rid for e in got] == ["a"]
    assert reader.pending_count() == 1
    got2 = reader.read(acks=got, spin=True)  # acknowledged in the same round trip
    assert [(e.msg.rid, e.msg.reason) for e in got2] == [("b", "y")]
    assert reader.pending_count() == 1
    assert redis.Redis.from_url(redis_url).pttl(reader.lease) > 0  # the lease is kept, as redis-py's read keeps it
    assert reader._spin is not None  # the read went through the spinning connection


def test_a_spinning_read_made_once_acknowledges_and_with_redis_gone_raises_not_at_once_quickly() -> None:
    server = RedisServer().start()
    try:
        link = RedisLink(server.url, quick_timeout_s=0.3)
        reader = StreamReader(link, "s", "g", "c1")
        reader.ensure_group()
        StreamWriter(link).send_many([("s", AbortReq("a", "x"))])
        got = reader.read(once=True, spin=True)
        assert [e.msg.rid for e in got] == ["a"] and reader._spin is not None
        assert reader.read(acks=got, once=True, spin=True) == []
        assert reader.pending_count() == 0  # acknowledged in the read's own round trip
    finally:
        server.stop()
    started = time.monotonic()
    with pytest.raises(NotAtOnce):
        reader.read(once=True, spin=True)
    with pytest.raises(NotAtOnce):  # now through redis-py's quick connection, and then the known outage
        reader.read(once=True, spin=True)
    assert time.monotonic() - started < 2.0
