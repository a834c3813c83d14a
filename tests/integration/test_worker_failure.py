"""Killing the worker mid-generation: every waiting client gets an explicit error within
10 seconds, and a restarted worker serves new requests. Stopping it (SIGTERM) drains it first."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.integration.conftest import start_stack
from tools.redis_server import RedisServer


async def _stream_until_end(client: httpx.AsyncClient, started: asyncio.Event) -> tuple[dict, float]:
    body = {"inputs": "The river was wide and calm.", "parameters": {"max_new_tokens": 900, "ignore_eos": True}}
    last: dict = {}
    async with client.stream("POST", "/generate_stream", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                started.set()
    return last, time.monotonic()


async def _plain(client: httpx.AsyncClient) -> tuple[int, dict, float]:
    body = {
        "inputs": "Pack my box with five dozen liquor jugs.",
        "parameters": {"max_new_tokens": 900, "ignore_eos": True},
    }
    r = await client.post("/generate", json=body)
    return r.status_code, r.json(), time.monotonic()


def test_worker_killed_mid_generation(tiny_llama: str, redis_server: RedisServer, tmp_path) -> None:
    stack = start_stack(tiny_llama, redis_server, str(tmp_path))
    try:

        async def scenario() -> tuple[list, float]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
                started = asyncio.Event()
                streams = [asyncio.create_task(_stream_until_end(client, started)) for _ in range(4)]
                plains = [asyncio.create_task(_plain(client)) for _ in range(4)]
                await asyncio.wait_for(started.wait(), 30)
                await asyncio.sleep(0.3)
                assert not any(t.done() for t in streams + plains), "generation ended before the kill"
                stack.kill_service("worker-0")
                killed_at = time.monotonic()
                results = await asyncio.gather(*streams, *plains)
                return results, killed_at

        results, killed_at = asyncio.run(scenario())
        for last, ended_at in results[:4]:
            assert last["finished"] and last["finish_reason"] == "error" and last["error"], last
            assert ended_at - killed_at < 10.0
        for status, body, ended_at in results[4:]:
            assert status == 500 and "failed" in body["error"], body
            assert ended_at - killed_at < 10.0
        # no worker: the front end says so at once
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            deadline = time.monotonic() + 10
            while client.get("/health").status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert client.get("/health").status_code == 503
            r = client.post("/generate", json={"inputs": "anyone?"})
            assert r.status_code == 503 and "no worker" in r.json()["error"]
        stack.start_service("worker-0")
        stack.wait_ready(timeout_s=60)
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            r = client.post("/generate", json={"inputs": "back again", "parameters": {"max_new_tokens": 5}})
            assert r.status_code == 200 and r.json()["count_output_tokens"] >= 1
    finally:
        stack.stop()


def test_a_lone_worker_told_to_stop_drains_then_its_requests_end_explicitly(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    """SIGTERM drains the group (test_fault_drain.py); with a 1 s drain timeout and no other group
    to go on, the requests still running end with an explicit error, and the group exits 0."""
    import signal

    stack = start_stack(tiny_llama, redis_server, str(tmp_path), env={"LS_DRAIN_TIMEOUT_S": "1"})
    try:

        async def scenario() -> tuple[list, float]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
                started = [asyncio.Event() for _ in range(3)]
                streams = [asyncio.create_task(_stream_until_end(client, s)) for s in started]
                # every stream has begun (a request whose first token had not come would get its
                # error as the HTTP status instead of as its stream's last event)
                await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 30)
                stack.signal_service("worker-0", signal.SIGTERM)
                stopped = time.monotonic()
                return await asyncio.gather(*streams), stopped

        results, stopped = asyncio.run(scenario())
        for last, ended_at in results:
            assert last["finish_reason"] == "error" and "worker" in last["error"], last
            assert ended_at - stopped < 10.0
        proc = stack.services["worker-0"].proc
        assert proc is not None and proc.wait(15) == 0
    finally:
        stack.stop()
