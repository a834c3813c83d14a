"""The Redis link through Redis Sentinel: a real master, replica and sentinels
(tools/redis_sentinel.py); the master killed, the link follows the promoted replica, and a
consumer group the new master lacks is made again."""

from __future__ import annotations

import asyncio

import pytest
import redis

from shared.config import CommonConfig, ConfigError
from shared.messages import AbortReq
from shared.redis_link import RedisLink, RedisTarget
from shared.redis_streams import StreamReader, StreamWriter
from tools.redis_sentinel import MASTER_NAME, SentinelSet


def test_sentinel_addresses_are_parsed_and_checked() -> None:
    cfg = CommonConfig(redis_sentinel="s1:26379, 10.0.0.2:26380,[::1]:26381", redis_master_name="m")
    assert cfg.sentinel_addresses == (("s1", 26379), ("10.0.0.2", 26380), ("::1", 26381))
    target = RedisTarget.of(cfg)
    assert target.sentinels == cfg.sentinel_addresses and target.master_name == "m"
    assert RedisTarget.of(CommonConfig()) == RedisTarget("redis://127.0.0.1:6379/0")
    for bad in ("s1", "s1:x", ":26379", "s1:0"):
        with pytest.raises(ConfigError, match="redis_sentinel"):
            CommonConfig(redis_sentinel=bad)
    with pytest.raises(ConfigError, match="redis_master_name"):
        CommonConfig(redis_sentinel="s1:1", redis_master_name="")


def test_url_gives_the_database_and_password_only() -> None:
    target = RedisTarget("rediss://u:pw@ignored:1/3", (("s", 1),), "m")
    assert target._master_options() == {"db": 3, "username": "u", "password": "pw", "ssl": True}


@pytest.fixture(scope="module")
def sentinels():
    with SentinelSet(sentinels=1) as s:
        yield s


def test_link_follows_the_promoted_replica_and_remakes_a_lost_group(sentinels: SentinelSet) -> None:
    target = RedisTarget("redis://127.0.0.1/0", ((("127.0.0.1", sentinels.ports[0])),), MASTER_NAME)
    link = RedisLink(target, max_backoff_s=0.2)
    reader = StreamReader(link, "s", "g", "c")
    writer = StreamWriter(link)
    writer.send("s", AbortReq("before", ""))
    held = reader.read(block_ms=200)
    assert [e.msg.rid for e in held] == ["before"]
    assert link.target.master_address(link.client) == f"127.0.0.1:{sentinels.master.port}"
    # the replica has "before" and its delivery before the master dies (replication is
    # asynchronous: on a loaded machine a kill right after the writes lost both, once in CI)
    assert link.call(lambda r: r.execute_command("WAIT", 1, 5000)) == 1

    sentinels.master.kill()
    writer.send("s", AbortReq("after", ""))  # waits with backoff until the sentinels name the replica
    assert link.target.master_address(link.client) == f"127.0.0.1:{sentinels.replica.port}"
    assert sentinels.master_port() == sentinels.replica.port
    assert [e.msg.rid for e in reader.read(block_ms=200)] == ["after"]

    # a new master without the group (one that never had it, or lost it): acknowledging what the
    # old group held is moot and sends still go out; the next read makes the group again
    link.call(lambda r: r.xgroup_destroy("s", "g"))
    writer.send_many([("s", AbortReq("later", ""))], acks=held)
    assert [e.msg.rid for e in reader.read(block_ms=200)] == ["before", "after", "later"]

    async def aread() -> list[str]:
        areader = StreamReader(link, "a", "g", "c")
        writer.send("a", AbortReq("async", ""))
        got = [e.msg.rid for e in await areader.aread(block_ms=200)]
        link.call(lambda r: r.xgroup_destroy("a", "g"))
        writer.send("a", AbortReq("again", ""))
        got += [e.msg.rid for e in await areader.aread(block_ms=200)]
        await areader.aclose()
        return got

    assert asyncio.run(aread()) == ["async", "async", "again"]
    link.close()


def test_sentinels_with_a_password_are_asked_with_it() -> None:
    """Sentinels with their own requirepass (Bitnami's chart sets one): --redis-sentinel-password
    finds the master through them; without it the question fails with their NOAUTH."""
    with SentinelSet(sentinels=1, password="sentinel-pw") as s:
        sentinels = (("127.0.0.1", s.ports[0]),)
        good = RedisTarget("redis://127.0.0.1/0", sentinels, MASTER_NAME, "sentinel-pw")
        client = good.client()
        assert client.ping() and good.master_address(client) == f"127.0.0.1:{s.master.port}"
        bad = RedisTarget("redis://127.0.0.1/0", sentinels, MASTER_NAME)
        with pytest.raises(redis.RedisError):
            bad.client().ping()
    cfg = CommonConfig(redis_sentinel="h:26379", redis_sentinel_password="pw")
    assert RedisTarget.of(cfg).sentinel_password == "pw" and "pw" not in repr(RedisTarget.of(cfg))
