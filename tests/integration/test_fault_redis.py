"""Fault suite: Redis killed for 10 s under load, then restarted (append-only, as compose runs
it). Nothing hangs: each request completes or ends with an explicit error within 10 s of the
fault, the errors name Redis (no worker group is declared dead for a silence Redis caused),
/health answers 503 while Redis is away, and the stack serves again within 5 s of its return."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.conftest import start_stack
from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts
from tools.redis_server import RedisServer
from tools.stack import Stack

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

MAX_NEW = 16
CLIENTS = 4
OUTAGE_S = 10.0


def test_redis_killed_for_10s_under_load(tiny_llama: str, tmp_path) -> None:
    redis = RedisServer(appendonly=True).start()
    stack = start_stack(tiny_llama, redis, str(tmp_path), workers=2)
    try:
        tally, health, killed, back, serving = asyncio.run(_outage(stack, redis))
    finally:
        stack.stop()
        redis.stop()
    print(tally.summary("redis killed for 10 s"), f"serving again {serving - back:.1f}s after its return")
    assert tally.count(LOST) == 0, tally.of(LOST)
    hit = [o for o in tally.outcomes if o.sent < back]  # sent before Redis came back
    late = [o for o in hit if o.ended - max(o.sent, killed) > 10.0]
    assert not late, late[:3]
    errors = tally.of(ERROR)
    assert errors and all("redis" in o.error for o in errors), [o.error for o in errors if "redis" not in o.error]
    assert not [o for o in tally.outcomes if o.sent > back + 5.0 and o.kind != COMPLETED]
    assert set(health) == {503}, health  # every /health answer while it was away
    assert serving - back < 5.0


async def _outage(stack: Stack, redis: RedisServer) -> tuple[Tally, list[int], float, float, float]:
    async with Load(stack.url, prompts(8), CLIENTS, MAX_NEW, bound_s=30) as load:
        await load.completed_since(time.monotonic(), 4, 60)
        redis.kill()
        killed = time.monotonic()
        health = []
        async with httpx.AsyncClient(base_url=stack.url, timeout=5) as client:
            await asyncio.sleep(2.0)  # the front end checks Redis every second
            while time.monotonic() < killed + OUTAGE_S:
                health.append((await client.get("/health")).status_code)
                await asyncio.sleep(0.5)
            await asyncio.to_thread(redis.start)
            back = time.monotonic()
            while (await client.get("/health")).status_code != 200:
                await asyncio.sleep(0.1)
        await load.completed_since(back, 1, 30)
        serving = min(o.ended for o in load.tally.of(COMPLETED) if o.sent >= back)
        await asyncio.sleep(6.0)  # and it goes on serving
    return load.tally, health, killed, back, serving
