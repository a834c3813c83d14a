"""A request's deadline ends it wherever it is: running on the worker (which frees its KV) or
waiting in the router's queue, each with a 504 before the front end's own timer fires.
(The queued path is pinned down deterministically in tests/router/test_simulation.py.)"""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.integration.conftest import start_stack
from tests.integration.router_live import (  # noqa: F401 (_long_llama: a fixture)
    RouterProbe,
    _long_llama,
    available,
    wait_until,
    worker_beats,
)
from tools.redis_server import RedisServer, free_port

TIMEOUT_S = 3.0  # the front end's request_timeout_s: every request's deadline
POOL = 16_100


def test_deadlines_end_requests_running_and_queued(long_llama: str, redis_server: RedisServer, tmp_path) -> None:
    port = free_port()
    stack = start_stack(
        long_llama,
        redis_server,
        str(tmp_path),
        tokenizer_args=["--request-timeout-s", str(TIMEOUT_S)],
        worker_args=["--max-total-token-num", str(POOL)],
        router_args=["--metrics-port", str(port), "--running-max-req-size", "1"],  # the second one queues
    )
    probe = RouterProbe(port)
    try:

        async def scenario() -> list[tuple[httpx.Response, float]]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:

                async def generate(prompt: str) -> tuple[httpx.Response, float]:
                    t0 = time.monotonic()
                    body = {"inputs": prompt, "parameters": {"max_new_tokens": 16_000, "ignore_eos": True}}
                    r = await client.post("/generate", json=body)
                    return r, time.monotonic() - t0

                return list(await asyncio.gather(generate("Runs past its deadline"), generate("Queued past it")))

        results = asyncio.run(scenario())
        for r, took in results:
            assert r.status_code == 504 and "deadline exceeded" in r.json()["error"], r.text
            # the worker or the router ended it, not the front end's own timer (request_timeout_s + 5 s)
            assert took < TIMEOUT_S + 5.0, took
        # one ran on the worker until its deadline; the other (whichever the router took second:
        # on a loaded machine not always the first sent) waited behind it with a deadline a few
        # milliseconds later, and ends in the router's queue, or (if the worker's status freeing
        # the slot arrives within those milliseconds) on the worker at once
        errors = [r.json()["error"] for r, _ in results]
        queued = [e for e in errors if "while queued" in e]
        assert len(queued) <= 1 and len(errors) - len(queued) >= 1, errors
        print(f"the requests ended: {errors}")
        rejected = probe.figures().get('rejected_total{reason="deadline"}', 0.0)
        assert rejected == float(len(queued))
        wait_until(
            lambda: available(worker_beats(redis_server.url, stack.opts.namespace)["0"].info) == POOL,
            15,
            "the worker's KV pool free again",
        )
    finally:
        stack.stop()
