"""Fault suite: a double fault. A worker group frozen with requests in flight, the router killed
and restarted, then the frozen group killed and restarted: the new router never hears of the
instance that held the requests. It finds them in the copies of what its predecessor placed
(shared/request_copies.py) and hands them over: nothing fails, nothing is lost, and the texts
are an unbroken stack's."""

from __future__ import annotations

import asyncio
import re
import signal
import time

import pytest

from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts, reference_texts
from tests.integration.router_live import RouterProbe, two_groups
from tools.redis_server import RedisServer
from tools.stack import Stack

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

MAX_NEW = 32
CLIENTS = 6


def test_a_group_lost_while_the_router_restarts_has_its_requests_handed_over(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    stack, probe = two_groups(tiny_llama, redis_server, str(tmp_path))
    try:
        reference, tally = asyncio.run(_double_fault(stack, probe))
    finally:
        stack.stop()
    log = (tmp_path / "router.log").read_text()
    handed = sum(int(n) for n in re.findall(r"handing over (\d+) requests of an earlier instance of group 0", log))
    print(tally.summary("group 0 lost while the router restarted"), f"handed over from copies: {handed}")
    assert handed > 0
    assert tally.count(LOST) == 0, tally.of(LOST)
    assert tally.count(ERROR) == 0, tally.of(ERROR)
    assert not tally.wrong_texts(reference), tally.wrong_texts(reference)[:3]
    assert tally.count(COMPLETED) > 0


async def _double_fault(stack: Stack, probe: RouterProbe) -> tuple[dict[str, str], Tally]:
    texts = prompts(6)
    reference = await reference_texts(stack.url, texts, MAX_NEW)
    async with Load(stack.url, texts, CLIENTS, MAX_NEW, bound_s=60) as load:
        await load.completed_since(time.monotonic(), 2, 90)
        await asyncio.to_thread(probe.holding, "0")
        stack.signal_service("worker-0", signal.SIGSTOP)  # holds its requests, sends nothing
        await asyncio.to_thread(stack.kill_service, "router")  # before it could declare group 0 dead
        stack.start_service("router")
        await asyncio.to_thread(stack.kill_service, "worker-0")
        stack.start_service("worker-0")
        await asyncio.to_thread(probe.wait_for, lambda f: f["worker_groups"] == 2, 90, "the new router knows both")
        await load.completed_since(time.monotonic(), 6, 90)
    return reference, load.tally
