"""Two worker groups on the CPU: requests spread over both; a group killed leaves the router's
placement, and restarted, it takes requests again. What a group's death does to the requests
it held is the fault suite's (test_fault_worker.py)."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import start_stack
from tests.integration.router_live import RouterProbe, admitted, plain_generate
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack


async def _burst(url: str, n: int, max_new: int) -> list[tuple[int, dict]]:
    async with httpx.AsyncClient(base_url=url, timeout=90) as client:
        return await asyncio.gather(*(plain_generate(client, f"Request number {i} says", max_new) for i in range(n)))


def test_two_worker_groups_share_the_load_and_take_back_a_restart(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    metrics_port = free_port()
    stack = start_stack(
        tiny_llama,
        redis_server,
        str(tmp_path),
        workers=2,
        # DEBUG: each placement; least_loaded: these prompts share their first words, which the
        # cache-aware policy would send to one group (tests/router covers that policy)
        router_args=["--metrics-port", str(metrics_port), "--log-level", "DEBUG", "--routing-policy", "least_loaded"],
    )
    probe = RouterProbe(metrics_port)
    try:
        probe.wait_for(lambda f: f["worker_groups"] == 2, 60, "both groups known to the router")
        _share_the_load(stack, probe)
        stack.kill_service("worker-1")
        probe.wait_for(lambda f: f["worker_groups"] == 1, 30, "the killed group declared dead")
        assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 4, 8)))  # the other serves
        _take_back_a_restart(stack, probe)
    finally:
        stack.stop()


def _share_the_load(stack: Stack, probe: RouterProbe) -> None:
    """Requests spread over both groups."""
    assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 6, 8)))
    f = probe.figures()
    assert admitted(f, "0") >= 1 and admitted(f, "1") >= 1, f
    # both groups report them ended, so the next requests are placed on even terms
    probe.wait_for(lambda f: f["running_requests"] == 0, 30, "the first requests reported ended")


def _take_back_a_restart(stack: Stack, probe: RouterProbe) -> None:
    """Restarted, the group takes requests again."""
    stack.start_service("worker-1")
    probe.wait_for(lambda f: f["worker_groups"] == 2, 90, "the restarted group rejoined")
    before = probe.figures()
    assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 6, 8)))
    assert admitted(probe.figures(), "1") > admitted(before, "1")
