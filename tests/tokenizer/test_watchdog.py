"""The front end's watchdog against a real redis-server: Redis itself unreachable, a router
gone for a while or for good, and the grace after Redis comes back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from services.tokenizer.pipeline import PendingRequest, Pipeline, Unavailable
from services.tokenizer.watchdog import DETOK_TAKEOVER_S, Watchdog
from shared.messages import AbortReq, Heartbeat, SamplingParams, TextItem, encode
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader
from shared.streams import SERVICE_DETOK, SERVICE_ROUTER, SERVICE_VISUAL, SERVICE_WORKER, StreamNames
from tests.polling import until
from tools.redis_server import RedisServer

NAMES = StreamNames("t")


@dataclass
class Req:
    detok: str = "d0"
    answered: bool = False
    images: bool = False


def beat(link: RedisLink, service: str, replica: str, at: float) -> None:
    hb = Heartbeat(service, replica, 1, 1.0, at, {})
    link.client.set(NAMES.heartbeat(service, replica), encode(hb), px=60_000)


def all_alive(link: RedisLink, at: float) -> None:
    for service, replica in ((SERVICE_WORKER, "w"), (SERVICE_DETOK, "d0"), (SERVICE_ROUTER, "r")):
        beat(link, service, replica, at)


@pytest.fixture
def server():
    with RedisServer() as s:
        yield s


def test_no_visual_replica_fails_the_image_requests_it_never_passed_on(redis_url: str) -> None:
    link = RedisLink(redis_url)
    dog = Watchdog(link, NAMES, dead_after_s=3.0, router_dead_after_s=8.0)
    now = time.time()
    all_alive(link, now)
    beat(link, SERVICE_VISUAL, "v0", now)
    dog.refresh(now)
    text, waiting, running = Req(), Req(images=True), Req(images=True, answered=True)
    assert dog.live.visuals and dog.orphans([text, waiting, running], now) == []
    all_alive(link, now + 4)
    dog.refresh(now + 4)  # the visual replica's last beat is 4 s old: dead
    assert dog.live.ready and not dog.live.visuals
    assert [(r, "visual" in why) for r, why in dog.orphans([text, waiting, running], now + 4)] == [(waiting, True)]


def test_a_router_gone_for_a_while_fails_only_what_it_never_answered(redis_url: str) -> None:
    link = RedisLink(redis_url)
    dog = Watchdog(link, NAMES, dead_after_s=3.0, router_dead_after_s=8.0)
    now = time.time()
    all_alive(link, now)
    dog.refresh(now)
    waiting, running = Req(), Req(answered=True)
    beat(link, SERVICE_WORKER, "w", now + 6)
    beat(link, SERVICE_DETOK, "d0", now + 6)
    link.client.delete(NAMES.heartbeat(SERVICE_ROUTER, "r"))  # its key expired
    dog.refresh(now + 6)  # 6 s without a router heartbeat: it may be restarting
    assert dog.live.ready and dog.orphans([waiting, running], now + 6) == []
    dog.refresh(now + 8.5)
    assert not dog.live.routers
    (orphan,) = dog.orphans([waiting, running], now + 8.5)
    assert orphan[0] is waiting and "router is not alive" in orphan[1]
    beat(link, SERVICE_ROUTER, "r", now + 9)  # restarted after all
    dog.refresh(now + 9)
    assert dog.live.ready and dog.orphans([waiting, running], now + 9) == []


def test_a_dead_detokenizers_requests_wait_for_a_takeover_then_end(redis_url: str) -> None:
    link = RedisLink(redis_url)
    dog = Watchdog(link, NAMES, dead_after_s=3.0, router_dead_after_s=8.0)
    now = time.time()
    all_alive(link, now)
    beat(link, SERVICE_DETOK, "d1", now)
    dog.refresh(now)
    on_d0, on_d1 = Req(detok="d0"), Req(detok="d1")
    link.client.delete(NAMES.heartbeat(SERVICE_DETOK, "d0"))  # d0 died
    for t in (1, 4, DETOK_TAKEOVER_S + 0.5):  # seen gone at 1 s: another shard may still take it over
        all_alive(link, now + t)
        link.client.delete(NAMES.heartbeat(SERVICE_DETOK, "d0"))
        beat(link, SERVICE_DETOK, "d1", now + t)
        dog.refresh(now + t)
        assert dog.orphans([on_d0, on_d1], now + t) == []
    (orphan,) = dog.orphans([on_d0, on_d1], now + 1.5 + DETOK_TAKEOVER_S)
    assert orphan[0] is on_d0 and "no other shard took its requests over" in orphan[1]
    all_alive(link, now + 6 + DETOK_TAKEOVER_S)  # d0 taken over (or back): served again
    dog.refresh(now + 6 + DETOK_TAKEOVER_S)
    assert dog.orphans([on_d0, on_d1], now + 6 + DETOK_TAKEOVER_S) == []


def test_redis_unreachable_is_seen_refused_and_after_a_while_fails_everything(server: RedisServer) -> None:
    link = RedisLink(server.url)
    dog = Watchdog(link, NAMES, dead_after_s=3.0, router_dead_after_s=8.0)
    now = time.time()
    all_alive(link, now)
    dog.refresh(now)
    assert dog.live.ready
    server.kill()
    t0 = time.monotonic()
    dog.refresh(now + 1)
    assert time.monotonic() - t0 < 3.0  # the check does not wait for Redis
    assert not dog.live.redis and not dog.live.ready
    reqs = [Req(), Req(answered=True)]
    assert dog.orphans(reqs, now + 2) == []  # a short outage: nothing fails yet
    failed = dog.orphans(reqs, now + 4.5)
    assert [r for r, _ in failed] == reqs and all("redis is unreachable" in why for _, why in failed)


def test_after_redis_comes_back_the_replicas_seen_before_count_as_alive_for_a_while(redis_url: str) -> None:
    link = RedisLink(redis_url)
    dog = Watchdog(link, NAMES, dead_after_s=3.0, router_dead_after_s=8.0)
    now = time.time()
    all_alive(link, now)
    dog.refresh(now)
    dog.redis_down_since = now + 1  # as if Redis was away from then on, every key lost
    link.client.flushall()
    assert dog.refresh(now + 11)  # back
    assert dog.live.ready and dog.orphans([Req()], now + 11) == []
    dog.refresh(now + 14.5)  # nobody beat since: now they are gone
    assert not dog.live.workers and dog.orphans([Req()], now + 14.5)[0][1] == "no worker is alive"


def test_with_redis_away_a_submission_is_refused_and_one_in_flight_ends_naming_redis(server: RedisServer) -> None:
    async def scenario() -> tuple[TextItem, float]:
        link = RedisLink(server.url)
        p = Pipeline(link, NAMES, "front-0", maxlen=1000, dead_after_s=1.0, check_s=0.2)
        all_alive(link, time.time())
        p.start(asyncio.get_running_loop())
        queue: asyncio.Queue[tuple[int, TextItem]] = asyncio.Queue()
        await p.submit("r0", [1, 2], SamplingParams(), [], True, time.time() + 60, queue, 0)
        server.kill()
        killed = time.monotonic()
        _, item = await asyncio.wait_for(queue.get(), 10)
        took = time.monotonic() - killed
        with pytest.raises(Unavailable, match="redis"):
            await p.submit("r1", [1, 2], SamplingParams(), [], True, time.time() + 60, queue, 0)
        p.stop()
        return item, took

    item, took = asyncio.run(scenario())
    assert item.finish_reason == "error" and "redis is unreachable" in item.error
    assert took < 4.0, took


def test_aborts_that_could_not_be_sent_go_out_once_redis_answers_again(server: RedisServer) -> None:
    async def scenario() -> list[str]:
        link = RedisLink(server.url)
        p = Pipeline(link, NAMES, "front-0", maxlen=1000, dead_after_s=0.5, check_s=60.0)  # checks by hand
        p.loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, TextItem]] = asyncio.Queue()
        for rid in ("a", "b"):
            p.pending[rid] = PendingRequest(rid, "d0", 2, queue, 0)
        server.kill()
        now = time.time()
        p.check(now)  # Redis away: seen
        p.check(now + 1.0)  # away for longer than dead_after_s: both fail, their aborts cannot be sent
        for _ in range(2):
            _, item = await asyncio.wait_for(queue.get(), 5)
            assert "redis is unreachable" in item.error
        await asyncio.to_thread(until, lambda: len(p._unsent) == 2, 10, "both aborts kept")
        server.start()
        p.check(time.time())  # it answers again: the kept aborts go out
        reader = StreamReader(RedisLink(server.url), NAMES.router, "g", "c")
        got = await asyncio.to_thread(until, lambda: reader.read(count=10), 10, "the aborts reach the router")
        p.stop()
        return sorted(e.msg.rid for e in got if isinstance(e.msg, AbortReq))

    assert asyncio.run(scenario()) == ["a", "b"]
