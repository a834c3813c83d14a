"""Redis's memory follows the load, not the history: after a burst of requests carrying large
stop strings, every stream is trimmed back to what is in flight (shared/stream_trim.py) and
used_memory returns to about where it was before the burst."""

from __future__ import annotations

import asyncio
import time

import httpx
import redis

from tests.integration.conftest import start_stack
from tools.redis_server import RedisServer

REQUESTS = 30
STOPS = [f"never seen {k} " + "x" * 20_000 for k in range(16)]  # 320 KB of stop strings a request


def _streams(r: redis.Redis, namespace: str) -> dict[str, int]:
    keys = r.scan_iter(match=f"{namespace}:*", _type="stream")
    return {k.decode(): r.xlen(k) for k in keys}


async def _burst(url: str) -> list[int]:
    body = {"inputs": "The river", "parameters": {"max_new_tokens": 8, "stop_sequences": STOPS}}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        rs = await asyncio.gather(*(client.post("/generate", json=body) for _ in range(REQUESTS)))
    return [r.status_code for r in rs]


def _settled(r: redis.Redis, namespace: str, bound: float, timeout_s: float = 15.0) -> tuple[dict[str, int], int]:
    """Until every stream holds at most 2 entries and used_memory is under bound."""
    end = time.monotonic() + timeout_s
    while True:
        streams, used = _streams(r, namespace), int(r.info("memory")["used_memory"])
        if (max(streams.values()) <= 2 and used <= bound) or time.monotonic() > end:
            return streams, used
        time.sleep(0.25)


def test_streams_and_used_memory_return_to_baseline_after_a_burst(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    stack = start_stack(tiny_llama, redis_server, str(tmp_path))
    r = redis.Redis.from_url(redis_server.url)
    ns = stack.opts.namespace
    try:
        assert asyncio.run(_burst(stack.url))[:1] == [200]  # the first requests' allocations, warmed up
        _, baseline = _settled(r, ns, float("inf"), timeout_s=3.0)
        statuses = asyncio.run(_burst(stack.url))
        streams, used = _settled(r, ns, baseline + 2**20)
    finally:
        stack.stop()
    print(f"baseline {baseline / 2**20:.2f} MB, after {REQUESTS} requests {used / 2**20:.2f} MB, streams {streams}")
    assert statuses == [200] * REQUESTS
    assert max(streams.values()) <= 2, streams  # each holds at most what a group needs next
    assert used <= baseline + 2**20  # 9.6 MB of stop strings went through; under 1 MB stays
