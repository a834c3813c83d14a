"""Two worker groups on the CPU: requests spread over both; a group that goes silent and is
killed under load has its unstarted requests finished by the other and its started ones
ended with an explicit error; nothing hangs; restarted, it takes requests again."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx

from tests.integration.conftest import start_stack
from tests.integration.router_probe import RouterProbe, admitted
from tools.redis_server import RedisServer, free_port


async def _stream(
    client: httpx.AsyncClient, prompt: str, max_new: int, started: asyncio.Event
) -> tuple[dict, int, float]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    last: dict = {}
    tokens = 0
    async with client.stream("POST", "/generate_stream", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                if (last.get("token") or {}).get("id") is not None:
                    tokens += 1
                    started.set()  # the client has output: the request has started
    return last, tokens, time.monotonic()


async def _plain(client: httpx.AsyncClient, prompt: str, max_new: int) -> tuple[int, dict]:
    r = await client.post(
        "/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    )
    return r.status_code, r.json()


async def _burst(url: str, n: int, max_new: int) -> list[tuple[int, dict]]:
    async with httpx.AsyncClient(base_url=url, timeout=90) as client:
        return await asyncio.gather(*(_plain(client, f"Request number {i} says", max_new) for i in range(n)))


def test_two_worker_groups_share_the_load_survive_a_death_and_take_back_a_restart(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    metrics_port = free_port()
    stack = start_stack(
        tiny_llama,
        redis_server,
        str(tmp_path),
        workers=2,
        worker_args=["--max-total-token-num", "2000"],
        router_args=["--metrics-port", str(metrics_port), "--log-level", "DEBUG"],  # DEBUG: each placement
    )
    probe = RouterProbe(metrics_port)
    try:
        probe.wait_for(lambda f: f["worker_groups"] == 2, 60, "both groups known to the router")

        # requests spread over both groups
        assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 6, 8)))
        f = probe.figures()
        assert admitted(f, "0") >= 1 and admitted(f, "1") >= 1, f
        # both groups report them ended, so the next requests are placed on even terms
        probe.wait_for(lambda f: f["running_requests"] == 0, 30, "the first requests reported ended")

        async def kill_under_load() -> tuple[list, list, float, dict]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=90) as client:
                started = [asyncio.Event() for _ in range(4)]
                longs = [
                    asyncio.create_task(_stream(client, f"Long story {i} begins", 300, started[i])) for i in range(4)
                ]
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
                f = probe.figures()
                assert f['group_running_requests{group="1"}'] >= 1, f  # requests with output on the group to kill
                # group 1 goes silent with requests running; the router keeps placing new ones
                # there until it declares the group dead, and those never start
                before = probe.figures()
                stack.signal_service("worker-1", signal.SIGSTOP)
                silent_at = time.monotonic()
                shorts = [asyncio.create_task(_plain(client, f"Short one {i}", 16)) for i in range(4)]
                placed = await asyncio.to_thread(
                    probe.wait_for,
                    lambda f: admitted(f, "1") > admitted(before, "1"),
                    30,
                    "a request placed on the silent group",
                )
                stack.kill_service("worker-1")
                long_results = await asyncio.wait_for(asyncio.gather(*longs), 120)
                short_results = await asyncio.wait_for(asyncio.gather(*shorts), 120)
                return long_results, short_results, silent_at, placed

        longs, shorts, silent_at, _ = asyncio.run(kill_under_load())
        failed = [(last, ended_at) for last, _, ended_at in longs if last["finish_reason"] == "error"]
        assert failed, f"no running request was on the killed group: {longs}"
        for last, tokens, _ in longs:
            if last["finish_reason"] == "error":
                assert last["finished"] and "worker group 1 died" in last["error"], last
            else:
                assert last["finish_reason"] == "length" and tokens == 300, (last, tokens)
        ended_after_s = max(ended_at for _, ended_at in failed) - silent_at
        print(f"started requests on the killed group ended {ended_after_s:.1f}s after it went silent")
        assert ended_after_s < 20.0  # declared dead 3 s after its last status, plus a loaded machine's delays
        for status, body in shorts:  # including those placed on the silent group: re-queued and finished
            assert status == 200 and body["count_output_tokens"] == 16, body
        f = probe.figures()
        assert f["requeued_total"] >= 1 and f["failed_total"] >= len(failed), f
        assert f["worker_groups"] == 1

        # restarted, the group takes requests again
        stack.start_service("worker-1")
        probe.wait_for(lambda f: f["worker_groups"] == 2, 90, "the restarted group rejoined")
        before = probe.figures()
        assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 6, 8)))
        assert admitted(probe.figures(), "1") > admitted(before, "1")
    finally:
        stack.stop()
