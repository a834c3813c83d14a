"""Registration with a FastChat controller, against a stub controller: register when the
pipeline is ready, heartbeats with the queue length, register again when forgotten, retry
a controller that does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx

from services.tokenizer.fastchat.registration import ControllerLink


class StubController:
    """Answers as FastChat's controller does; forgets the worker or fails on demand."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.known: set[str] = set()
        self.down = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.calls.append((request.url.path, body))
        if self.down:
            return httpx.Response(502)
        if request.url.path == "/register_worker":
            self.known.add(body["worker_name"])
            return httpx.Response(200, json=None)
        return httpx.Response(200, json={"exist": body["worker_name"] in self.known})

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]


async def _until(done: Any, task: asyncio.Task, timeout_s: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + timeout_s
    while not done():
        assert asyncio.get_running_loop().time() < end, "not within the time"
        assert not task.done(), task
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def running(link: ControllerLink):
    task = asyncio.create_task(link.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _link(stub: StubController, status: dict[str, Any], ready: list[bool]) -> ControllerLink:
    return ControllerLink(
        "http://controller:21001/",
        "http://worker:8000",
        lambda: dict(status),
        lambda: ready[0],
        interval_s=0.01,
        retry_s=0.01,
        transport=httpx.MockTransport(stub.handle),
    )


def test_registers_when_ready_then_beats_with_the_queue_length() -> None:
    stub, ready = StubController(), [False]
    status = {"model_names": ["m", "alias"], "speed": 1, "queue_length": 0}

    async def run() -> None:
        async def later() -> None:
            await asyncio.sleep(0.1)
            assert stub.calls == [], "registered before the pipeline was ready"
            ready[0] = True
            while not stub.calls:
                await asyncio.sleep(0.005)
            status["queue_length"] = 7

        flip = asyncio.create_task(later())
        async with running(_link(stub, status, ready)) as task:
            await _until(lambda: any(b.get("queue_length") == 7 for _, b in stub.calls), task)
        await flip

    asyncio.run(run())
    path, body = stub.calls[0]
    assert path == "/register_worker"
    assert body == {
        "worker_name": "http://worker:8000",
        "check_heart_beat": True,
        "worker_status": {"model_names": ["m", "alias"], "speed": 1, "queue_length": 0},
        "multimodal": False,
    }
    beats = [b for p, b in stub.calls if p == "/receive_heart_beat"]
    assert beats and all(set(b) == {"worker_name", "queue_length"} for b in beats)
    assert stub.paths().count("/register_worker") == 1


def test_registers_again_when_the_controller_forgot_it_and_retries_one_that_is_down() -> None:
    stub, ready = StubController(), [True]
    stub.down = True

    async def run() -> None:
        async with running(_link(stub, {"model_names": ["m"], "speed": 1, "queue_length": 0}, ready)) as task:
            await _until(lambda: len(stub.calls) >= 3, task)  # refused registrations, retried
            stub.down = False
            await _until(lambda: "/receive_heart_beat" in stub.paths(), task)
            stub.down = True
            beats = stub.paths().count("/receive_heart_beat")
            await _until(lambda: stub.paths().count("/receive_heart_beat") >= beats + 2, task)  # retried
            stub.known.clear()  # the controller restarted: it answers exist: false
            stub.down = False
            before = stub.paths().count("/register_worker")
            await _until(lambda: stub.paths().count("/register_worker") > before and stub.known, task)

    asyncio.run(run())
    assert stub.paths()[:3] == ["/register_worker"] * 3
