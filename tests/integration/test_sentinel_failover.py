"""Redis Sentinel: the stack follows the master to its replica when the master is killed.

A master, its replica and three sentinels (tools/redis_sentinel.py); the services find the
master through the sentinels (--redis-sentinel, --redis-master-name). Eight clients send
greedy requests in a loop; the master is killed under that load. Every request either
completes with the text it had before the failover or ends with an explicit error; none is
lost (no answer within LOST_AFTER_S); requests after the failover succeed within
FOLLOW_WITHIN_S of the kill."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.conftest import start_stack
from tools.redis_sentinel import MASTER_NAME, SentinelSet

pytestmark = pytest.mark.slow

CLIENTS = 8
MAX_NEW = 24
LOST_AFTER_S = 30.0  # a request with no answer this long is lost (the front end's own timeout is longer)
FOLLOW_WITHIN_S = 15.0  # from the kill until a request sent after it completes
LOAD_AFTER_KILL_S = 10.0
PROMPTS = [f"Request number {i} asks about the weather in town {i}." for i in range(CLIENTS)]


@dataclass
class Outcome:
    client: int
    sent: float
    ended: float
    status: int  # 0: no answer (lost)
    text: str = ""
    error: str = ""


async def _one(http: httpx.AsyncClient, i: int) -> Outcome:
    sent = time.monotonic()
    body = {"inputs": PROMPTS[i], "parameters": {"max_new_tokens": MAX_NEW}}
    try:
        r = await http.post("/generate", json=body, timeout=LOST_AFTER_S)
    except httpx.TimeoutException:
        return Outcome(i, sent, time.monotonic(), 0)
    data = r.json()
    text = data.get("generated_text", [""])[0] if r.status_code == 200 else ""
    return Outcome(i, sent, time.monotonic(), r.status_code, text, "" if r.status_code == 200 else str(data))


async def _load(http: httpx.AsyncClient, i: int, until: list[float]) -> list[Outcome]:
    out = []
    while time.monotonic() < until[0]:
        out.append(await _one(http, i))
    return out


def test_stack_follows_a_sentinel_failover(tiny_llama: str, tmp_path) -> None:
    with SentinelSet(sentinels=3) as sentinels:
        env = {"LS_REDIS_SENTINEL": sentinels.addresses, "LS_REDIS_MASTER_NAME": MASTER_NAME}
        stack = start_stack(tiny_llama, sentinels.master, str(tmp_path), env=env)
        try:
            report = asyncio.run(_scenario(stack.url, sentinels))
        finally:
            stack.stop()
    print(report["summary"])
    assert report["lost"] == 0, report["summary"]
    assert report["completed_after_kill"] >= 1, report["summary"]
    assert report["follow_s"] < FOLLOW_WITHIN_S, report["summary"]
    for o in report["outcomes"]:
        if o.status == 200:
            assert o.text == report["reference"][o.client], o  # greedy: the same text before and after
        else:
            assert o.status >= 500 and o.error, o  # an explicit error, with a body that says so


async def _scenario(url: str, sentinels: SentinelSet) -> dict:
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=2 * CLIENTS)) as http:
        first = await asyncio.gather(*(_one(http, i) for i in range(CLIENTS)))
        assert all(o.status == 200 for o in first), first
        reference = {o.client: o.text for o in first}
        until = [float("inf")]
        loads = [asyncio.create_task(_load(http, i, until)) for i in range(CLIENTS)]
        await asyncio.sleep(2.0)
        sentinels.master.kill()
        killed = time.monotonic()
        until[0] = killed + LOAD_AFTER_KILL_S
        promoted_s = await asyncio.to_thread(sentinels.wait_promoted, 30.0)
        outcomes = [o for load in await asyncio.gather(*loads) for o in load]
        after = await asyncio.gather(*(_one(http, i) for i in range(CLIENTS)))
    assert all(o.status == 200 for o in after), after
    outcomes += after
    done_after = [o for o in outcomes if o.sent > killed and o.status == 200]
    follow_s = min(o.ended for o in done_after) - killed if done_after else float("inf")
    in_flight = [o for o in outcomes if o.sent <= killed < o.ended]
    count = {
        "completed": sum(o.status == 200 for o in outcomes),
        "failed": sum(o.status not in (0, 200) for o in outcomes),
        "lost": sum(o.status == 0 for o in outcomes),
    }
    summary = (
        f"requests: {len(outcomes)}, completed {count['completed']}, failed explicitly {count['failed']}, "
        f"lost {count['lost']}; in flight at the kill: {len(in_flight)} (completed "
        f"{sum(o.status == 200 for o in in_flight)}, failed {sum(o.status not in (0, 200) for o in in_flight)}); "
        f"replica promoted {promoted_s:.1f}s after the kill, first request sent after the kill done at {follow_s:.1f}s"
    )
    return {
        **count,
        "outcomes": outcomes,
        "reference": reference,
        "follow_s": follow_s,
        "completed_after_kill": len(done_after),
        "summary": summary,
    }
