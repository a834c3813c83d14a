"""Host a's side of the multi-host tensor-parallel test, run there (``ip netns exec``):
Redis, the router, a detokenizer, the front end and the worker group's node 0 (rank 0), on
host a's loopback but for the group's rendezvous on its link; then the requests, all at once.
Prints one JSON line: each request's output token ids, or why the stack did not serve.

python -m tests.integration.multinode_driver MODEL_DIR HOST:PORT LOG_DIR PROMPTS_JSON MAX_NEW
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx

from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions


async def _generate(url: str, prompts: list[str], max_new: int) -> list[list[int]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [{"inputs": p, "parameters": {"max_new_tokens": max_new, "return_details": True}} for p in prompts]
        answers = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
    return [[t["id"] for t in a.json()["tokens"]] for a in answers]


def main(argv: list[str]) -> int:
    model_dir, dist, log_dir, prompts, max_new = argv[0], argv[1], argv[2], json.loads(argv[3]), int(argv[4])
    node0 = ["--device", "cpu", "--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", dist]
    with RedisServer() as redis:
        opts = StackOptions(model_dir, redis.url, free_port(), namespace="mn", log_dir=log_dir, worker_args=node0)
        stack = Stack(opts).start()
        try:
            stack.wait_ready(timeout_s=240)
            print(json.dumps({"ids": asyncio.run(_generate(stack.url, prompts, max_new))}), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
            return 1
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
