"""The whole stack spread over hosts made of network namespaces (tools/netns_hosts.py), for
tests/integration/test_hosts.py: Redis on one host, the router and the front end on another,
two worker groups on a host each, the detokenizer on another, and a client host. Every service
reaches the others only over its host's link, by the addresses its flags name."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from tests.integration.router_live import Figures, RouterProbe
from tools.netns_hosts import Hosts
from tools.stack import Stack

T = TypeVar("T")

HOSTS = ["redis", "front", "work0", "work1", "detok", "client"]
# each service of tools/stack.py's stack -> the host it runs on
PLACES = {"router": "front", "tokenizer": "front", "worker-0": "work0", "worker-1": "work1", "detokenizer-0": "detok"}


@dataclass
class Spread:
    hosts: Hosts
    stack: Stack
    metrics_port: int  # the router's, on the front host

    @property
    def url(self) -> str:
        """The front end at the front host's address: from the client host, across the bridge."""
        return self.stack.url

    def on(self, host: str, coro: Coroutine[Any, Any, T]) -> T:
        """Run coro on an event loop of its own on host (its sockets are that host's)."""
        return self.hosts.run(host, asyncio.run, coro)

    def figures(self) -> Figures:
        """The router's figures, read on its host."""
        return self.hosts.run("front", RouterProbe(self.metrics_port).figures)

    async def figures_when(self, cond: Any, timeout_s: float, what: str) -> Figures:
        """The router's figures once cond(figures) holds, polled from the caller's event loop."""
        end = asyncio.get_running_loop().time() + timeout_s
        got: Figures = {}
        while asyncio.get_running_loop().time() < end:
            got = await asyncio.to_thread(self.figures)
            if got and cond(got):
                return got
            await asyncio.sleep(0.1)
        raise AssertionError(f"not within {timeout_s}s: {what} (last figures: {got})")

    def settle(self, timeout_s: float = 60.0) -> None:
        """Until both groups are placed on and the front end answers ready: what each test
        starts from (the test before may have cut a link)."""

        async def ready() -> None:
            await self.figures_when(lambda f: f["worker_groups"] == 2, timeout_s, "both worker groups alive")
            async with httpx.AsyncClient(base_url=self.url, timeout=5) as client:
                while (await client.get("/health")).status_code != 200:
                    await asyncio.sleep(0.1)

        self.on("client", ready())
