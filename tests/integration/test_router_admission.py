"""Admission and backpressure through the real stack: a request no pool can hold gets a 400
at once, a full queue a 503 with Retry-After (from the router, then from the front end on
its own), a request queued too long a 504; and an abort (client gone while queued or
running, a stop string) removes the request and frees its KV."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import start_stack
from tests.integration.router_live import (  # noqa: F401 (_long_llama: a fixture)
    LONG_CONTEXT,
    RouterProbe,
    _long_llama,
    available,
    wait_until,
    worker_beats,
)
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack

HOG = 16_000  # output tokens of a request that runs until its client leaves
POOL = HOG + 100  # KV tokens: below the model's limit, so the pool is what refuses a larger request
QUEUE_TIME_S = 6.0


@pytest.fixture(scope="module")
def stack(long_llama: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    port = free_port()
    s = start_stack(
        long_llama,
        redis_server,
        str(tmp_path_factory.mktemp("logs-admission")),
        worker_args=["--max-total-token-num", str(POOL)],
        # the front end reads the router's queue figures every 4 s instead of every second, so
        # the first requests after the queue fills reach the router (which refuses them) before
        # the front end knows to refuse by itself, even on a loaded machine
        tokenizer_args=["--pipeline-check-s", "4"],
        router_args=[
            *("--metrics-port", str(port), "--running-max-req-size", "1"),  # one request at a time: the rest queue
            *("--max-waiting", "2", "--max-queue-time-s", str(QUEUE_TIME_S)),
        ],
    )
    s.probe = RouterProbe(port)  # type: ignore[attr-defined]
    yield s
    s.stop()


def _body(prompt: str, max_new: int, **extra) -> dict:
    return {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True, **extra}}


async def _stream(client: httpx.AsyncClient, body: dict, started: asyncio.Event | None = None) -> dict:
    """Stream a generation; as a client should, retry after a 503 when told to (the front end
    refuses from the router's heartbeat, which can say the queue is full for a second or two
    after it has drained)."""
    for _ in range(30):
        last: dict = {}
        async with client.stream("POST", "/generate_stream", json=body) as r:
            if r.status_code == 503:
                await asyncio.sleep(float(r.headers["Retry-After"]))
                continue
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    last = json.loads(line[6:])
                    if started is not None and (last.get("token") or {}).get("id") is not None:
                        started.set()
            return last
    raise AssertionError("still refused after 30 tries")


def _post(client: httpx.Client, body: dict) -> dict:
    """/generate, retried after a 503 as _stream does."""
    for _ in range(30):
        r = client.post("/generate", json=body)
        if r.status_code != 503:
            assert r.status_code == 200, r.text
            return r.json()
        time.sleep(float(r.headers["Retry-After"]))
    raise AssertionError("still refused after 30 tries")


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _pool_free(stack: Stack) -> None:
    """The worker's KV pool is entirely free again (its heartbeat says so)."""
    wait_until(
        lambda: available(worker_beats(stack.opts.redis_url, stack.opts.namespace)["0"].info) == POOL,
        15,
        "the worker's KV pool free again",
    )


def test_a_request_no_pool_can_hold_is_refused_at_the_front_with_a_400(stack: Stack) -> None:
    too_big = POOL + 100
    assert too_big < LONG_CONTEXT - 10  # within the model's limit
    r = httpx.post(stack.url + "/generate", json=_body("Too big", too_big), timeout=30)
    assert r.status_code == 400, r.text
    assert f"largest worker pool holds {POOL}" in r.json()["error"]
    assert not r.json()["error"].startswith("generation failed")  # the front answered, nothing was queued
    assert not any(k.startswith("rejected_total") for k in stack.probe.figures())  # type: ignore[attr-defined]


def test_a_full_queue_is_refused_with_503_and_a_queued_request_times_out_with_504(stack: Stack) -> None:
    probe: RouterProbe = stack.probe  # type: ignore[attr-defined]

    async def scenario() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
            started = asyncio.Event()
            hog = asyncio.create_task(_stream(client, _body("Hold the only slot", HOG), started))
            await asyncio.wait_for(started.wait(), 60)
            queued = [asyncio.create_task(client.post("/generate", json=_body(f"Queued {i}", 4))) for i in range(2)]
            await asyncio.to_thread(probe.wait_for, lambda f: f["waiting_requests"] == 2, 30, "a full queue")
            # more requests until the front end refuses by itself, from the router's heartbeat
            # (until then the router refuses them, or they take a place the deadline frees)
            extra: list[asyncio.Task] = []
            front_refused = False
            for _ in range(100):
                extra.append(asyncio.create_task(client.post("/generate", json=_body("One more", 4))))
                await asyncio.sleep(0.2)
                front_refused = any(
                    t.done() and "cannot take requests now: overloaded" in t.result().text for t in extra
                )
                if front_refused:
                    break
            assert front_refused, "the front end never refused on its own"
            queued_results = await asyncio.gather(*queued)
            extra_results = await asyncio.gather(*extra)
            await _cancel(hog)
            return queued_results, extra_results

    queued, extra = asyncio.run(scenario())
    for r in queued:
        assert r.status_code == 504, r.text
        assert f"waited more than {QUEUE_TIME_S:g}s in the router's queue" in r.json()["error"]
    assert any("generation failed: overloaded" in r.text for r in extra), "the router never refused"
    for r in extra:
        assert r.status_code in (503, 504), r.text
        if r.status_code == 503:
            assert r.headers["Retry-After"] == "1" and "overloaded" in r.json()["error"]
    _pool_free(stack)


def test_a_client_gone_while_queued_or_running_is_removed_and_its_kv_freed(stack: Stack) -> None:
    probe: RouterProbe = stack.probe  # type: ignore[attr-defined]
    aborted_before = probe.figures()["aborted_total"]

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
            started = asyncio.Event()
            hog = asyncio.create_task(_stream(client, _body("Running until its client leaves", HOG), started))
            await asyncio.wait_for(started.wait(), 60)
            waiter = asyncio.create_task(_stream(client, _body("Waiting until its client leaves", 10)))
            await asyncio.to_thread(probe.wait_for, lambda f: f["waiting_requests"] == 1, 30, "one queued")
            await _cancel(waiter)
            await asyncio.to_thread(
                probe.wait_for,
                lambda f: f["waiting_requests"] == 0 and f["aborted_total"] == aborted_before + 1,
                30,
                "the queued request dropped",
            )
            await _cancel(hog)

    asyncio.run(scenario())
    probe.wait_for(lambda f: f["aborted_total"] == aborted_before + 2, 30, "the running request aborted")
    _pool_free(stack)


def test_a_stop_string_ends_the_request_and_frees_its_kv(stack: Stack) -> None:
    probe: RouterProbe = stack.probe  # type: ignore[attr-defined]
    prompt = "Once upon a time there was a small town by the sea."
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        text = _post(client, _body(prompt, 30))["generated_text"][0]
        stop = text[8:11]
        aborted_before = probe.figures()["aborted_total"]
        got = _post(client, _body(prompt, HOG, stop_sequences=[stop]))
    assert got["finish_reason"] == "stop" and got["generated_text"] == [text[: text.index(stop)]]
    # the detokenizer's abort went through the router to the worker
    probe.wait_for(lambda f: f["aborted_total"] == aborted_before + 1, 30, "the stop string's abort")
    _pool_free(stack)
