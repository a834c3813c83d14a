"""The router service on a real redis-server: what its delivery guarantees rest on."""

from __future__ import annotations

import uuid
from dataclasses import replace

import httpx
import redis
from prometheus_client import CollectorRegistry

from services.router.metrics import RouterCollector
from services.router.service import RouterService
from shared.config import RouterConfig
from shared.messages import (
    AdmitReqs,
    GenerateReq,
    Handover,
    RunningReq,
    RunningTable,
    SamplingParams,
    WorkerStatus,
)
from shared.metrics import serve_metrics
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import GROUP_DETOK, GROUP_WORKER
from tools.redis_server import free_port


def _cfg(redis_url: str, namespace: str) -> RouterConfig:
    return RouterConfig(redis_url=redis_url, namespace=namespace, replica="router-0")


def _status(instance: str, capacity: int, running: list[RunningReq], seq: int = 0) -> WorkerStatus:
    free = capacity - sum(r.held_tokens for r in running)
    return WorkerStatus("0", instance, capacity, free, 64, seq, RunningTable.of(running), 0.0)


def _gen(rid: str, prompt: int, max_new: int) -> GenerateReq:
    return GenerateReq(rid, "f", "d", [1] * prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True), 0.0, 0.0)


def _round(service: RouterService, writer: StreamWriter, *msgs: object) -> None:
    for m in msgs:
        writer.send(service.names.router, m)
    service.step(service.reader.read(count=100, block_ms=200))


def _admitted(link: RedisLink, service: RouterService) -> list[str]:
    reader = StreamReader(link, service.names.worker("0"), GROUP_WORKER, consumer="check")
    return [r.rid for e in reader.read(count=100) if isinstance(e.msg, AdmitReqs) for r in e.msg.reqs]


def test_a_router_restarted_under_the_same_name_takes_over_its_predecessors_queue(redis_url: str) -> None:
    link = RedisLink(redis_url)
    ns = "t" + uuid.uuid4().hex[:8]
    writer = StreamWriter(link)
    first = RouterService(_cfg(redis_url, ns), link)
    full = [RunningReq("big", "d", 10, 90, 10)]
    _round(first, writer, _status("w1", 100, full), _gen("queued", 10, 50))
    assert [r.rid for r in first.core.waiting] == ["queued"]
    assert first.reader.pending_count() == 1  # held unacknowledged while it waits
    # the first router dies; its lease runs out
    redis.Redis.from_url(redis_url).delete(first.reader.lease)
    second = RouterService(_cfg(redis_url, ns), link)
    _round(second, writer, _status("w1", 100, full))  # this read hands it the claimed entries
    _round(second, writer)  # and this one the status
    assert [r.rid for r in second.core.waiting] == ["queued"]
    assert set(second.core.where) == {"big"}  # learnt from the status alone
    _round(second, writer, _status("w1", 100, []))  # "big" ended: room for "queued"
    assert _admitted(link, second) == ["queued"]
    assert second.reader.pending_count() == 0


def test_a_request_of_a_lost_group_goes_through_its_shard_and_is_held_until_admitted_again(redis_url: str) -> None:
    link = RedisLink(redis_url)
    ns = "t" + uuid.uuid4().hex[:8]
    writer = StreamWriter(link)
    service = RouterService(_cfg(redis_url, ns), link)
    _round(service, writer, _status("w1", 100, []), _gen("r", 10, 20))
    assert service.reader.pending_count() == 0  # admitted and acknowledged
    # the group restarts, and its new instance is full: "r" goes to its detokenizer shard
    _round(service, writer, _status("w2", 100, [RunningReq("other", "d", 10, 90, 10)]))
    shard = StreamReader(link, service.names.detok("d"), GROUP_DETOK, consumer="check")
    (handover,) = [e.msg for e in shard.read(count=100) if isinstance(e.msg, Handover)]
    assert handover.req.rid == "r" and "restarted" in handover.why
    assert not service.core.waiting and "r" not in service.core.where
    # the shard sends it back with the output its client had (none): queued, held unacknowledged
    _round(service, writer, replace(handover.req, handovers=1))
    assert [r.rid for r in service.core.waiting] == ["r"] and "r" in service.queued
    assert service.reader.pending_count() == 1
    _round(service, writer, _status("w2", 100, []))
    assert service.reader.pending_count() == 0
    assert service.core.where.get("r") == "0"


def test_a_restarted_router_hands_over_what_its_predecessor_placed(redis_url: str) -> None:
    link = RedisLink(redis_url)
    ns = "t" + uuid.uuid4().hex[:8]
    writer = StreamWriter(link)
    first = RouterService(_cfg(redis_url, ns), link)
    _round(first, writer, _status("w1", 100, []), _gen("r", 10, 20), _gen("s", 5, 20))
    assert sorted(_admitted(link, first)) == ["r", "s"]
    copies = first.names.placed("0")
    assert sorted(link.client.hkeys(copies)) == [b"r", b"s"]
    running = [RunningReq("r", "d", 10, 13, 17), RunningReq("s", "d", 5, 6, 19)]
    _round(first, writer, _status("w1", 100, running, seq=1 << 20))
    _round(first, writer, _status("w1", 100, running[:1], seq=1 << 20))  # "s" ended: its copy goes
    assert link.client.hkeys(copies) == [b"r"]
    # the first router dies; the second learns "r" from the group's status and its copy
    second = RouterService(_cfg(redis_url, ns), link)
    _round(second, writer, _status("w1", 100, running[:1], seq=1 << 20))
    assert set(second.core.where) == {"r"}
    assert second.core.groups["0"].placed["r"].req == _gen("r", 10, 20)
    _round(second, writer, _status("w2", 100, []))  # the group restarted: "r" goes on elsewhere
    shard = StreamReader(link, second.names.detok("d"), GROUP_DETOK, consumer="check")
    (handover,) = [e.msg for e in shard.read(count=100) if isinstance(e.msg, Handover)]
    assert handover.req == _gen("r", 10, 20) and "restarted" in handover.why
    assert link.client.hkeys(copies) == []  # it left the group


def test_a_group_that_died_while_no_router_ran_has_its_requests_handed_over(redis_url: str) -> None:
    link = RedisLink(redis_url)
    ns = "t" + uuid.uuid4().hex[:8]
    writer = StreamWriter(link)
    first = RouterService(_cfg(redis_url, ns), link)
    _round(first, writer, _status("w1", 100, []), _gen("r", 10, 20))
    # the router dies, and so does the group's instance w1, unseen; w2 is what the next router hears of
    second = RouterService(_cfg(redis_url, ns), link)
    _round(second, writer, _status("w2", 100, []))
    shard = StreamReader(link, second.names.detok("d"), GROUP_DETOK, consumer="check")
    (handover,) = [e.msg for e in shard.read(count=100) if isinstance(e.msg, Handover)]
    assert handover.req == _gen("r", 10, 20) and second.core.stats.requeued == 1
    assert link.client.hkeys(second.names.placed("0")) == []


def test_the_router_serves_its_figures_to_prometheus(redis_url: str) -> None:
    link = RedisLink(redis_url)
    ns = "t" + uuid.uuid4().hex[:8]
    writer = StreamWriter(link)
    service = RouterService(_cfg(redis_url, ns), link)
    _round(service, writer, _status("w1", 1_000, [RunningReq("p", "d", 10, 30, 70, paused=True)]), _gen("a", 10, 5))
    registry = CollectorRegistry()
    registry.register(RouterCollector(lambda: service.figures))
    port = free_port()
    assert serve_metrics(port, registry, addr="127.0.0.1")
    assert not serve_metrics(0, registry)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    for line in (
        "lightstream_router_waiting_requests 0.0",
        "lightstream_router_running_requests 2.0",
        "lightstream_router_paused_requests 1.0",
        'lightstream_router_group_capacity_tokens{group="0"} 1000.0',
        'lightstream_router_group_used_tokens{group="0"} 30.0',
        'lightstream_router_admitted_total{group="0"} 1.0',
        'lightstream_router_routed_total{group="0",matched="false"} 1.0',
        'lightstream_router_group_cached_tokens{group="0"} 0.0',
        'lightstream_router_group_index_tokens{group="0"} 10.0',
        "lightstream_router_worker_groups 1.0",
    ):
        assert line in text, line
