"""The stream helpers against a real redis-server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from shared.messages import AbortReq
from shared.redis_link import RedisLink
from shared.redis_streams import FIELD, StreamReader, StreamWriter
from tools.redis_server import RedisServer, free_port


def test_send_read_ack(redis_url: str) -> None:
    link = RedisLink(redis_url)
    reader = StreamReader(link, "s", "g", "c1")
    reader.ensure_group()  # idempotent
    writer = StreamWriter(link)
    writer.send("s", AbortReq("a", "x"))
    writer.send_many([("s", AbortReq("b", "y")), ("s", AbortReq("c", "z"))])
    got = reader.read(block_ms=100)
    assert [e.msg.rid for e in got] == ["a", "b", "c"]
    assert reader.pending_count() == 3
    reader.ack(got)
    assert reader.pending_count() == 0
    assert reader.read(block_ms=50) == []


def test_messages_sent_before_the_group_exists_are_read(redis_url: str) -> None:
    link = RedisLink(redis_url)
    StreamWriter(link).send("early", AbortReq("first", ""))
    reader = StreamReader(link, "early", "g", "c")
    assert [e.msg.rid for e in reader.read(block_ms=100)] == ["first"]


def test_dead_consumers_pending_entries_are_claimed(redis_url: str) -> None:
    link = RedisLink(redis_url)
    writer = StreamWriter(link)
    dead = StreamReader(link, "s", "g", "dead", claim_idle_ms=300)
    for rid in "abc":
        writer.send("s", AbortReq(rid, ""))
    taken = dead.read(block_ms=100)
    assert len(taken) == 3  # read, never acknowledged: the consumer "dies" here
    heir = StreamReader(link, "s", "g", "heir", claim_idle_ms=300, claim_every_s=0.0)
    assert heir.read(block_ms=50) == []  # too early: the dead one may still be alive
    time.sleep(0.4)
    claimed = heir.read(block_ms=50)
    assert sorted(e.msg.rid for e in claimed) == ["a", "b", "c"]
    heir.ack(claimed)
    assert heir.pending_count() == 0
    names = [c["name"] for c in redis.Redis.from_url(redis_url).xinfo_consumers("s", "g")]
    assert b"dead" not in names and "dead" not in names


def test_a_consumer_that_releases_its_lease_is_claimed_from_at_once(redis_url: str) -> None:
    link = RedisLink(redis_url)
    StreamWriter(link).send("s", AbortReq("queued", ""))
    leaving = StreamReader(link, "s", "g", "leaving", claim_idle_ms=60_000)
    assert len(leaving.read(block_ms=100)) == 1
    leaving.release()  # a clean exit: no need to wait out the minute's lease
    heir = StreamReader(link, "s", "g", "heir", claim_idle_ms=60_000)
    assert [e.msg.rid for e in heir.read(block_ms=50)] == ["queued"]


def test_a_live_consumer_is_not_robbed(redis_url: str) -> None:
    link = RedisLink(redis_url)
    writer = StreamWriter(link)
    a = StreamReader(link, "s", "g", "a", claim_idle_ms=300, claim_every_s=0.0)
    b = StreamReader(link, "s", "g", "b", claim_idle_ms=300, claim_every_s=0.0)
    writer.send("s", AbortReq("x", ""))
    held = a.read(block_ms=50)
    assert len(held) == 1
    for _ in range(5):  # a keeps reading (alive) while its entry stays pending
        time.sleep(0.1)
        a.read(block_ms=10)
        assert b.read(block_ms=10) == []


def test_send_many_acks_in_the_same_transaction(redis_url: str) -> None:
    link = RedisLink(redis_url)
    writer = StreamWriter(link)
    inbox = StreamReader(link, "in", "g", "c")
    writer.send("in", AbortReq("x", ""))
    entries = inbox.read(block_ms=50)
    writer.send_many([("out", AbortReq("y", ""))], acks=entries)
    assert inbox.pending_count() == 0
    assert redis.Redis.from_url(redis_url).xlen("out") == 1


def test_streams_are_capped(redis_url: str) -> None:
    writer = StreamWriter(RedisLink(redis_url), maxlen=100)
    writer.send_many([("capped", AbortReq(str(i), "")) for i in range(2000)])
    assert redis.Redis.from_url(redis_url).xlen("capped") < 400  # MAXLEN ~ trims by whole nodes


def test_undecodable_entries_are_dropped(redis_url: str) -> None:
    link = RedisLink(redis_url)
    reader = StreamReader(link, "s", "g", "c")
    link.client.xadd("s", {FIELD: b"\xc1garbage"})
    StreamWriter(link).send("s", AbortReq("ok", ""))
    got = reader.read(block_ms=100)
    assert [e.msg.rid for e in got] == ["ok"]
    reader.ack(got)
    assert reader.pending_count() == 0


@pytest.mark.parametrize("how", ["read", "aread"])
def test_a_group_that_forgot_its_last_deliveries_does_not_repeat_them(how: str, redis_url: str) -> None:
    """A replica promoted by a Sentinel failover may hold the group as it was a few reads ago
    (replication is asynchronous): its reads of new entries start again below what this reader
    handed out. Those come back acknowledged, not handed out twice; later entries come as ever."""
    link = RedisLink(redis_url)
    reader = StreamReader(link, "s", "g", "c")
    writer = StreamWriter(link)
    for rid in ("a", "b", "c"):
        writer.send("s", AbortReq(rid, ""))
    got = reader.read(block_ms=100)
    assert [e.msg.rid for e in got] == ["a", "b", "c"]
    reader.ack(got[:1])
    link.client.xgroup_setid("s", "g", got[0].entry_id)  # the group as the replica had it: "a" delivered
    writer.send("s", AbortReq("d", ""))

    def read() -> list[str]:
        if how == "read":
            return [e.msg.rid for e in reader.read(block_ms=100)]
        return [e.msg.rid for e in asyncio.run(reader.aread(block_ms=100))]

    later = read()
    if not later:  # the read that met only repeated entries: the next one brings the new
        later = read()
    assert later == ["d"]
    # what came again is acknowledged (a failover loses the acknowledgements made after the
    # replica's copy too); "d" is pending until its reader acknowledges it
    pending = link.client.xpending_range("s", "g", min="-", max="+", count=10)
    assert [p["message_id"] for p in pending] == [link.client.xrange("s", min="-", max="+")[-1][0]]


def test_survives_redis_restart() -> None:
    first = RedisServer().start()
    second = RedisServer(port=first.port)
    try:
        link = RedisLink(first.url, max_backoff_s=0.2)
        reader = StreamReader(link, "s", "g", "c")
        writer = StreamWriter(link)

        def read() -> list[str]:
            return [e.msg.rid for e in reader.read(block_ms=200)]

        writer.send("s", AbortReq("before", ""))
        assert read() == ["before"]
        first.stop()
        # the same port comes back after a while, empty: the stream and its group are gone
        t = threading.Timer(0.5, second.start)
        t.start()
        writer.send("s", AbortReq("after", ""))  # retries with backoff until redis answers
        t.join()
        assert read() == ["after"]  # NOGROUP -> the group is made again, from the start
        writer.send("s", AbortReq("later", ""))
        time.sleep(0.15)
        assert read() == ["later"]
    finally:
        first.stop()
        second.stop()


def test_the_links_clients_try_each_call_once() -> None:
    """Retrying is the link's (call, which a stop ends): its clients fail at once against a closed
    port, without redis-py's own retries (ten tries, about 4 s, in its plain constructor)."""
    link = RedisLink(f"redis://127.0.0.1:{free_port()}")
    for c in (link.client, link.quick):
        t = time.perf_counter()
        with pytest.raises(redis.ConnectionError):
            c.ping()
        assert time.perf_counter() - t < 1


@pytest.fixture
def cutter(redis_server: RedisServer, redis_url: str):
    from tests.shared.answer_cutter import AnswerCutter

    proxy = AnswerCutter("127.0.0.1", redis_server.port)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("how", ["blocking", "polling", "async"])
def test_a_read_whose_answer_is_lost_is_recovered(how: str, cutter, redis_url: str) -> None:
    """Redis serves a read (its entries become this consumer's pending ones) but the answer never
    arrives. The next read takes exactly those entries, not the ones the consumer still holds
    unacknowledged, as the router holds its queue: nothing is lost and nothing comes twice.
    ``read`` tries again by itself (RedisLink.call); ``aread``'s caller tries again."""
    link = RedisLink(cutter.url, max_backoff_s=0.1)
    writer = StreamWriter(RedisLink(redis_url))
    reader = StreamReader(link, "cut", "g", "c1")
    loop = asyncio.new_event_loop()

    def read() -> list[str]:
        if how != "async":
            return [e.msg.rid for e in reader.read(block_ms=200 if how == "blocking" else None)]
        try:
            return [e.msg.rid for e in loop.run_until_complete(reader.aread(block_ms=200))]
        except redis.ConnectionError:  # the answer cut off: the caller reads again (the front end: after a pause)
            return [e.msg.rid for e in loop.run_until_complete(reader.aread(block_ms=200))]

    writer.send("cut", AbortReq("held", ""))
    assert read() == ["held"]  # handed out, never acknowledged
    writer.send_many([("cut", AbortReq(rid, "")) for rid in ("lost-1", "lost-2")])
    cutter.cut_next_answer_with(b"lost-1")
    got = read()
    got += [] if got else read()
    assert cutter.cuts == 1
    assert got == ["lost-1", "lost-2"]
    assert reader.pending_count() == 3
    writer.send("cut", AbortReq("new", ""))
    assert read() == ["new"]
    raw = redis.Redis.from_url(redis_url)
    assert all(p["times_delivered"] <= 2 for p in raw.xpending_range("cut", "g", "-", "+", 10))
    loop.run_until_complete(reader.aclose())
    loop.close()


def test_a_recovery_read_that_comes_back_full_goes_on(cutter, redis_url: str) -> None:
    """The lost answer held more entries than the next reads take: they go on recovering, in
    order, until one comes back short, and then read new entries. The lost read is an event
    loop's (aread) and the next ones are not: the two share what was handed out."""
    link = RedisLink(cutter.url, max_backoff_s=0.1)
    writer = StreamWriter(RedisLink(redis_url))
    reader = StreamReader(link, "full", "g", "c1")
    writer.send_many([("full", AbortReq(f"e{k}", "")) for k in range(5)])
    cutter.cut_next_answer_with(b"e0")
    with pytest.raises(redis.ConnectionError):
        asyncio.run(reader.aread(count=5))  # all five taken, the answer lost
    writer.send("full", AbortReq("new", ""))
    reads = [[e.msg.rid for e in reader.read(count=2, block_ms=100)] for _ in range(4)]
    assert reads == [["e0", "e1"], ["e2", "e3"], ["e4"], ["new"]]
    assert cutter.cuts == 1


def test_a_claim_whose_answer_is_lost_still_hands_the_entries_over(cutter, redis_url: str) -> None:
    """XCLAIM moved the dead consumer's entries to the heir, but the answer never came: the
    claim is made again with the same ids, and gives them."""
    direct = RedisLink(redis_url)
    writer = StreamWriter(direct)
    dead = StreamReader(direct, "claimcut", "g", "dead", claim_idle_ms=200)
    writer.send_many([("claimcut", AbortReq(f"claim-{k}", "")) for k in range(3)])
    assert len(dead.read(block_ms=100)) == 3  # read, never acknowledged
    heir = StreamReader(
        RedisLink(cutter.url, max_backoff_s=0.1), "claimcut", "g", "heir", claim_idle_ms=200, claim_every_s=0.0
    )
    time.sleep(0.3)  # the dead one's lease has expired
    cutter.cut_next_answer_with(b"claim-0")
    got = [e.msg.rid for e in heir.read(block_ms=50)]
    assert cutter.cuts == 1
    assert got == ["claim-0", "claim-1", "claim-2"]
    raw = redis.Redis.from_url(redis_url)
    owners = {p["consumer"] for p in raw.xpending_range("claimcut", "g", "-", "+", 10)}
    assert owners == {b"heir"}
    assert b"dead" not in [c["name"] for c in raw.xinfo_consumers("claimcut", "g")]
