"""The front end's submission against a real redis-server: sent from the event loop at low
load, from the I/O pool under load or when Redis does not answer at once, in order either way
(the detokenizer's registration before the router's request)."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.tokenizer.pipeline import AT_ONCE_MAX_PENDING, Liveness, Pipeline
from shared.messages import DetokRegister, GenerateReq, Heartbeat, SamplingParams, TextItem
from shared.redis_link import NotAtOnce, RedisLink, client
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import StreamNames
from tools.redis_server import free_port


def beat(service: str, replica: str) -> Heartbeat:
    return Heartbeat(service, replica, 1, time.time(), time.time(), {})


def pipeline(link: RedisLink) -> Pipeline:
    p = Pipeline(link, StreamNames("t"), "front-0", maxlen=1000, dead_after_s=3.0, check_s=1.0)
    p.live = Liveness(
        workers={"w": beat("worker", "w")}, detoks={"d0": beat("detokenizer", "d0")}, routers={"r": beat("router", "r")}
    )
    return p


async def submit_many(p: Pipeline, n: int) -> list[str]:
    queue: asyncio.Queue[tuple[int, TextItem]] = asyncio.Queue()
    rids = [f"r{i}" for i in range(n)]
    for rid in rids:
        await p.submit(rid, [1, 2, 3], SamplingParams(), [], True, time.time() + 60, queue, 0)
    return rids


def delivered(link: RedisLink, p: Pipeline) -> tuple[list[str], list[str]]:
    names = p.names
    router = StreamReader(link, names.router, "g", "c").read(count=1000, block_ms=100)
    detok = StreamReader(link, names.detok("d0"), "g", "c").read(count=1000, block_ms=100)
    assert all(isinstance(e.msg, GenerateReq) for e in router)
    assert all(isinstance(e.msg, DetokRegister) for e in detok)
    return [e.msg.rid for e in router], [e.msg.rid for e in detok]


@pytest.mark.parametrize("n", [1, AT_ONCE_MAX_PENDING + 3])
def test_each_submission_reaches_the_router_and_its_detokenizer(redis_url: str, n: int) -> None:
    link = RedisLink(redis_url)
    p = pipeline(link)
    rids = asyncio.run(submit_many(p, n))  # past AT_ONCE_MAX_PENDING, through the I/O pool
    assert delivered(link, p) == (rids, rids)
    p.stop()


def test_when_redis_does_not_answer_at_once_the_pool_sends_it(redis_url: str) -> None:
    link = RedisLink(redis_url)
    link.quick = client(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=0.2)  # nothing listens there
    p = pipeline(link)
    t = time.perf_counter()
    rids = asyncio.run(submit_many(p, 1))
    assert time.perf_counter() - t < 5
    assert delivered(link, p) == (rids, rids)
    p.stop()


def test_send_once_refuses_at_once_without_redis() -> None:
    link = RedisLink(f"redis://127.0.0.1:{free_port()}", quick_timeout_s=0.2)
    writer = StreamWriter(link)
    t = time.perf_counter()
    with pytest.raises(NotAtOnce):
        writer.send_many([("s", beat("x", "y"))], once=True)
    with pytest.raises(NotAtOnce):  # the outage is known now: no second try to connect
        writer.send_many([("s", beat("x", "y"))], once=True)
    assert time.perf_counter() - t < 2


def test_a_draining_detokenizer_gets_no_new_request_while_another_serves(redis_url: str) -> None:
    link = RedisLink(redis_url)
    p = pipeline(link)
    leaving = Heartbeat("detokenizer", "d1", 1, time.time(), time.time(), {"draining": 1.0})
    p.live.detoks = {"d0": beat("detokenizer", "d0"), "d1": leaving}
    assert {p._pick_detok(f"r{i}").replica for i in range(50)} == {"d0"}
    p.live.detoks = {"d1": leaving}  # the only one: still used (503 for all would be worse)
    assert p._pick_detok("r0").replica == "d1"
    p.stop()
