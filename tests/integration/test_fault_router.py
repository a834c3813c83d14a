"""Fault suite: the router killed under load. Restarted within its grace (5 s), it takes over
the queue its predecessor left in its stream: nothing is lost and nothing fails. Killed for
good, every request ends within 10 s: those already running on a worker group complete, the
others end with an explicit error (services/tokenizer/watchdog.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import start_stack
from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts
from tools.redis_server import RedisServer
from tools.stack import Stack

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

MAX_NEW = 16
CLIENTS = 4


@pytest.fixture(scope="module")
def stack(tiny_llama: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(tiny_llama, redis_server, str(tmp_path_factory.mktemp("logs-router-faults")))
    yield s
    s.stop()


def test_a_router_restarted_within_its_grace_loses_nothing(stack: Stack) -> None:
    tally, killed = asyncio.run(_router_away(stack, back_after_s=5.0))
    print(tally.summary("router killed and restarted after 5 s"))
    assert tally.count(LOST) == 0 and tally.count(ERROR) == 0, tally.of(LOST) + tally.of(ERROR)
    # requests sent while it was away waited for it and completed
    assert [o for o in tally.of(COMPLETED) if killed < o.sent < killed + 5.0]


def test_a_router_killed_for_good_ends_every_request_within_10s(stack: Stack) -> None:
    tally, killed = asyncio.run(_router_away(stack, back_after_s=None))
    print(tally.summary("router killed for good"))
    assert tally.count(LOST) == 0, tally.of(LOST)
    assert not tally.slow_to_end(killed, 10.0), tally.slow_to_end(killed, 10.0)[:3]
    errors = tally.of(ERROR)
    assert errors and all("router is not alive" in o.error for o in errors), errors[:3]
    # once it is taken for dead, new requests are refused at once
    assert any(o.status == 503 and o.ended - o.sent < 1.0 for o in errors)
    stack.start_service("router")
    stack.wait_ready(60)


async def _router_away(stack: Stack, back_after_s: float | None) -> tuple[Tally, float]:
    """Load through the kill; the router back after back_after_s (None: never); the load goes
    on 12 s after the kill, and then until requests complete again (when it came back)."""
    async with Load(stack.url, prompts(8), CLIENTS, MAX_NEW, bound_s=30) as load:
        await load.completed_since(time.monotonic(), 4, 60)
        await asyncio.to_thread(stack.kill_service, "router")
        killed = time.monotonic()
        if back_after_s is not None:
            await asyncio.sleep(back_after_s)
            stack.start_service("router")
        await asyncio.sleep(killed + 12.0 - time.monotonic())
        if back_after_s is not None:
            await load.completed_since(time.monotonic(), 4, 60)
    return load.tally, killed


def test_health_says_which_service_is_missing(stack: Stack) -> None:
    body = httpx.get(stack.url + "/health", timeout=10).json()
    assert body["status"] == "ok" and body["redis"] == "ok" and body["routers"] == ["router-0"]
