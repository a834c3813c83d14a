"""The router killed and restarted under load: requests in flight finish (or end with an
explicit error), new requests are served, and the new router rebuilds its state from the
workers' statuses and takes over the queue its predecessor left unacknowledged."""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from tests.integration.conftest import start_stack
from tests.integration.router_live import (  # noqa: F401 (_long_llama: a fixture)
    RouterProbe,
    _long_llama,
    available,
    plain_generate,
    stream_generate,
    wait_until,
    worker_beats,
)
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack

HOG = 8_000  # output tokens of a request that runs until its client leaves
# the third running request: long enough that the queued ones are still waiting when the
# probe looks on a loaded machine, short enough to fit the pool beside the two hogs
SHORT = 450
POOL = 2 * HOG + 500


def test_router_killed_and_restarted_under_load(long_llama: str, redis_server: RedisServer, tmp_path) -> None:
    metrics_port = free_port()
    # three requests at a time per group, so later ones wait in the router's queue
    stack = start_stack(
        long_llama,
        redis_server,
        str(tmp_path),
        worker_args=["--max-total-token-num", str(POOL)],
        router_args=["--metrics-port", str(metrics_port), "--running-max-req-size", "3"],
    )
    probe = RouterProbe(metrics_port)
    try:
        finished, queued, new, rebuilt = asyncio.run(_restart_under_load(stack, probe))
        print(f"the restarted router's first figures: {rebuilt}")
        (last, tokens, _), *_ = finished
        assert (last["finish_reason"], tokens) == ("length", SHORT) or last["finish_reason"] == "error", last
        for status, body in queued:
            assert status == 200 and body["count_output_tokens"] == 12, body
        assert new[0] == 200 and new[1]["count_output_tokens"] == 6, new
        # the aborted requests' KV is free again, and the router holds nothing
        probe.wait_for(
            lambda f: f["aborted_total"] >= 2 and f["running_requests"] == 0, 30, "aborts reached the worker"
        )
        ns = stack.opts.namespace
        wait_until(
            lambda: available(worker_beats(redis_server.url, ns)["0"].info) == POOL,
            10,
            "the worker's pool free again",
        )
    finally:
        stack.stop()


async def _restart_under_load(stack: Stack, probe: RouterProbe) -> tuple[list, list, tuple[int, dict], dict]:
    """Three running requests and three queued; the router killed and restarted; the two long
    ones' clients leave. Returns the short one's result, the queued ones', a new request's
    after the restart, and the new router's first figures that show the running requests."""
    async with httpx.AsyncClient(base_url=stack.url, timeout=90) as client:
        started = [asyncio.Event() for _ in range(3)]
        lengths = (HOG, HOG, SHORT)
        running = [
            asyncio.create_task(stream_generate(client, f"Tale {i} opens", n, started[i]))
            for i, n in enumerate(lengths)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        queued = [asyncio.create_task(plain_generate(client, f"Queued {i}", 12)) for i in range(3)]
        await asyncio.to_thread(probe.wait_for, lambda f: f["waiting_requests"] == 3, 30, "3 queued")

        stack.kill_service("router")
        stack.start_service("router")
        # the new router knows the running requests from the worker's status alone
        rebuilt = await asyncio.to_thread(
            probe.wait_for,
            lambda f: f["worker_groups"] == 1 and f["running_requests"] >= 2,
            60,
            "the new router learnt the running requests",
        )
        # the clients of the two long ones go away: the new router must route their aborts
        for task in running[:2]:
            task.cancel()
        for task in running[:2]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        short_one = await asyncio.wait_for(running[2], 120)
        # claimed from the dead router's pending entries once its lease ran out, then served
        queued_results = await asyncio.wait_for(asyncio.gather(*queued), 120)
        await asyncio.to_thread(stack.wait_ready, 60)
        new = await plain_generate(client, "A new request after the restart", 6)
        return [short_one], queued_results, new, rebuilt
