"""Two front-end processes on one port (--reuse-port): new connections spread over both, each
answers its own requests in full, and the port keeps serving when one of them stops."""

from __future__ import annotations

import asyncio
import os

import httpx

from tests.integration.conftest import start_stack
from tests.integration.router_live import plain_generate
from tools.redis_server import RedisServer


async def _fresh_connections(url: str, n: int) -> list[tuple[int, dict]]:
    async def one(i: int) -> tuple[int, dict]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # a connection of its own
            return await plain_generate(client, f"Front end request {i}", 6)

    return await asyncio.gather(*(one(i) for i in range(n)))


def _served(log_dir: str, name: str) -> int:
    with open(os.path.join(log_dir, f"{name}.log")) as f:
        return sum("submitted:" in line for line in f)


def test_two_front_ends_share_one_port(tiny_llama: str, redis_server: RedisServer, tmp_path) -> None:
    log_dir = str(tmp_path / "logs")
    stack = start_stack(tiny_llama, redis_server, log_dir, fronts=2)
    try:
        results = asyncio.run(_fresh_connections(stack.url, 24))
        assert all(status == 200 and body["generated_text"] for status, body in results), results
        served = [_served(log_dir, "tokenizer"), _served(log_dir, "tokenizer-1")]
        assert sum(served) == 24 and min(served) > 0, served
        stack.kill_service("tokenizer-1")
        results = asyncio.run(_fresh_connections(stack.url, 6))
        assert all(status == 200 and body["generated_text"] for status, body in results), results
    finally:
        stack.stop()
