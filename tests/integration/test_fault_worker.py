"""Fault suite: worker groups killed under load (two groups, greedy requests). A killed group's
requests are handed over to the other through their detokenizer shards and go on by
recomputation: nothing is lost, nothing fails, and every text is the one an unbroken stack
gives (docs/router.md, Failures). Every other kill first freezes the group (SIGSTOP) for a
second: the router goes on placing requests on it, which never start there."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.integration.conftest import start_stack
from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts, reference_texts
from tests.integration.router_live import RouterProbe, wait_until, worker_beats
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

# one plain kill and one of a frozen group in CI; the acceptance run: LS_FAULT_KILLS=10
KILLS = int(os.environ.get("LS_FAULT_KILLS", "2"))
MAX_NEW = 32
CLIENTS = 6


def test_worker_groups_killed_under_load_lose_nothing_and_keep_the_greedy_text(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    metrics_port = free_port()
    stack = start_stack(
        tiny_llama, redis_server, str(tmp_path), workers=2, router_args=["--metrics-port", str(metrics_port)]
    )
    probe = RouterProbe(metrics_port)
    try:
        probe.wait_for(lambda f: f["worker_groups"] == 2, 60, "both groups known to the router")
        reference, tally = asyncio.run(_kill_groups(stack, probe))
        figures = probe.figures()
    finally:
        stack.stop()
    print(tally.summary(f"{KILLS} worker groups killed"), f"handed over: {figures['requeued_total']:.0f}")
    assert tally.count(LOST) == 0, tally.of(LOST)
    assert tally.count(ERROR) == 0, tally.of(ERROR)
    assert not tally.wrong_texts(reference), tally.wrong_texts(reference)[:3]
    assert tally.count(COMPLETED) > 0 and figures["requeued_total"] >= KILLS and figures["failed_total"] == 0


async def _kill_groups(stack: Stack, probe: RouterProbe) -> tuple[dict[str, str], Tally]:
    texts = prompts(12)
    reference = await reference_texts(stack.url, texts, MAX_NEW)
    async with Load(stack.url, texts, CLIENTS, MAX_NEW, bound_s=40) as load:
        for k in range(KILLS):
            group = str(k % 2)
            await load.completed_since(time.monotonic(), 2, 60)  # requests flow
            await asyncio.sleep(0.5)  # and are in flight on both groups
            before = await asyncio.to_thread(probe.figures)
            if k % 2:
                stack.signal_service(f"worker-{group}", signal.SIGSTOP)
                await asyncio.sleep(1.0)
            await asyncio.to_thread(stack.kill_service, f"worker-{group}")
            stack.start_service(f"worker-{group}")
            await asyncio.to_thread(_wait_rejoined, stack, probe, group, before)
        await load.completed_since(time.monotonic(), 4, 60)  # and keep flowing after the last
    return reference, load.tally


def _wait_rejoined(stack: Stack, probe: RouterProbe, group: str, before: dict[str, float]) -> None:
    """Until the restarted group beats and the router has handed its requests over and taken
    it back (a new instance)."""
    wait_until(lambda: group in worker_beats(stack.opts.redis_url, stack.opts.namespace), 60, f"group {group} beats")
    probe.wait_for(
        lambda f: f["worker_groups"] == 2 and f["requeued_total"] > before["requeued_total"],
        60,
        f"group {group}'s requests handed over and the group back",
    )
