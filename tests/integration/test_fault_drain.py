"""Fault suite: a worker group told to stop (SIGTERM) under load, two groups, greedy requests.
It drains (services/worker/service.py): the router places nothing more on it, and what it holds
either finishes there (a drain within its timeout) or goes on on the other group (the timeout
passed: handed over). Either way nothing is lost, nothing fails, every text is the one an
unbroken stack gives, and the group exits 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid

import pytest

from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts, reference_texts
from tests.integration.router_live import RouterProbe, admitted, running_key, wait_until
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

MAX_NEW = 32
CLIENTS = 6


def test_a_draining_group_takes_nothing_new_and_what_it_holds_ends_well(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    metrics_port = free_port()
    opts = StackOptions(
        tiny_llama,
        redis_server.url,
        free_port(),
        workers=2,
        namespace="t" + uuid.uuid4().hex[:8],
        log_dir=str(tmp_path),
        router_args=["--metrics-port", str(metrics_port)],
    )
    stack = Stack(opts)
    stack.services["worker-0"].env["LS_DRAIN_TIMEOUT_S"] = "60"  # finishes what it holds
    stack.services["worker-1"].env["LS_DRAIN_TIMEOUT_S"] = "0"  # hands it all over at once
    probe = RouterProbe(metrics_port)
    try:
        stack.start().wait_ready(timeout_s=120)
        probe.wait_for(lambda f: f["worker_groups"] == 2, 60, "both groups known to the router")
        reference, tally, drained, left = asyncio.run(_drain_both(stack, probe))
    finally:
        stack.stop()
    print(tally.summary("two worker groups drained"), f"drained: {drained}", f"left: {left}")
    assert tally.count(LOST) == 0, tally.of(LOST)
    assert tally.count(ERROR) == 0, tally.of(ERROR)
    assert tally.count(COMPLETED) > 0
    assert not tally.wrong_texts(reference), tally.wrong_texts(reference)[:3]
    assert drained["held"] > 0 and drained["placed_while_draining"] == 0 and drained["handed_over"] == 0
    assert left["held"] > 0 and left["handed_over"] >= 1


async def _drain_both(stack: Stack, probe: RouterProbe) -> tuple[dict[str, str], Tally, dict, dict]:
    texts = prompts(12)
    reference = await reference_texts(stack.url, texts, MAX_NEW)
    async with Load(stack.url, texts, CLIENTS, MAX_NEW, bound_s=40) as load:
        drained = await _drain(stack, probe, load, "0")
        stack.start_service("worker-0")
        await asyncio.to_thread(probe.wait_for, lambda f: f["worker_groups"] == 2, 60, "group 0 back")
        left = await _drain(stack, probe, load, "1")
        await load.completed_since(time.monotonic(), 4, 60)  # and requests keep flowing on group 0
    return reference, load.tally, drained, left


async def _drain(stack: Stack, probe: RouterProbe, load: Load, group: str) -> dict[str, float]:
    """SIGTERM one group under load; -> what it held then, what the router placed on it while it
    drained, and how many requests were handed over from it."""
    await load.completed_since(time.monotonic(), 2, 60)  # requests flow
    before = await asyncio.to_thread(probe.holding, group)  # and some are on this group
    stack.signal_service(f"worker-{group}", signal.SIGTERM)
    await asyncio.sleep(0.3)  # the router has read its draining status
    seen = await asyncio.to_thread(probe.figures)
    proc = stack.services[f"worker-{group}"].proc
    assert proc is not None
    code = await asyncio.to_thread(_exit_code, proc, 60)
    assert code == 0, f"worker-{group} exited with {code}"
    await asyncio.to_thread(
        wait_until, lambda: probe.figures().get("worker_groups") == 1, 10, f"group {group} gone from the router"
    )
    after = await asyncio.to_thread(probe.figures)
    return {
        "held": before[running_key(group)],
        "placed_while_draining": admitted(after, group) - admitted(seen, group),
        "handed_over": after["requeued_total"] - before["requeued_total"],
    }


def _exit_code(proc: subprocess.Popen, timeout_s: float) -> int:
    return proc.wait(timeout_s)
