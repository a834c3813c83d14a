"""Host a's side of the multi-host tensor-parallel test, run there (``ip netns exec``):
Redis, the router, a detokenizer, the front end and the worker group's node 0 (rank 0), on
host a's loopback but for the group's rendezvous on its link. It says what it saw as one
JSON line per step on stdout, and waits for the test's word on stdin where the test acts:

1. ``{"ids": [...]}``: the prompts' greedy output ids, all sent at once;
2. ``{"streaming": true}``: long streams are running (the test cuts host b's link now);
   then ``{"ended": [{"finish_reason", "error", "at"}]}``: how each ended, and when (time.time());
3. after a line on stdin (the test restored the link and started node 1 again): node 0
   started again, then ``{"ids": [...]}`` once more.

python -m tests.integration.multinode_driver MODEL_DIR HOST:PORT LOG_DIR PROMPTS_JSON MAX_NEW
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions

STREAMS = 4


def say(what: dict) -> None:
    print(json.dumps(what), flush=True)


async def _generate(url: str, prompts: list[str], max_new: int) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [{"inputs": p, "parameters": {"max_new_tokens": max_new, "return_details": True}} for p in prompts]
        answers = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    return [[t["id"] for t in a.json()["tokens"]] for a in answers]


async def _stream(client: httpx.AsyncClient, started: asyncio.Event, count: list[int]) -> dict:
    body = {"inputs": "A long story:", "parameters": {"max_new_tokens": 900, "ignore_eos": True}}
    last: dict = {}
    async with client.stream("POST", "/generate_stream", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                if not started.is_set():
                    count[0] += 1
                    if count[0] == STREAMS:
                        started.set()
    return {"finish_reason": last.get("finish_reason"), "error": last.get("error", ""), "at": time.time()}


async def _streams_through_a_cut(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        started, count = asyncio.Event(), [0]
        tasks = [asyncio.create_task(_stream(client, started, count)) for _ in range(STREAMS)]
        await asyncio.wait_for(started.wait(), 60)
        say({"streaming": True})
        return list(await asyncio.gather(*tasks))


def _until_unready(url: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while httpx.get(url + "/health", timeout=5).status_code == 200:
        if time.monotonic() > end:
            raise TimeoutError("the front end still sees the group that left")
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    model_dir, dist, log_dir, prompts, max_new = argv[0], argv[1], argv[2], json.loads(argv[3]), int(argv[4])
    node0 = ["--device", "cpu", "--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", dist]
    with RedisServer() as redis:
        opts = StackOptions(model_dir, redis.url, free_port(), namespace="mn", log_dir=log_dir, worker_args=node0)
        stack = Stack(opts).start()
        try:
            stack.wait_ready(timeout_s=240)
            say({"ids": asyncio.run(_generate(stack.url, prompts, max_new))})
            say({"ended": asyncio.run(_streams_through_a_cut(stack.url))})
            sys.stdin.readline()
            stack.services["worker-0"].proc.wait(30)  # type: ignore[union-attr]  # it left on the cut
            _until_unready(stack.url)  # its heartbeat gone: ready next means the new group is
            stack.start_service("worker-0")
            stack.wait_ready(timeout_s=240)
            say({"ids": asyncio.run(_generate(stack.url, prompts, max_new))})
        except Exception as e:
            say({"error": f"{type(e).__name__}: {e}"})
            return 1
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
