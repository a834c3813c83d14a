"""unless_disconnected: the work's result, or a 499 when the client goes first, awaited in the
caller's own task, and no cancellation of that task left behind either way."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from services.tokenizer.errors import CLIENT_CLOSED, APIError
from services.tokenizer.fanout import unless_disconnected


def request_gone_when(gone: asyncio.Event) -> Request:
    """A request whose client disconnects once ``gone`` is set (its body already read)."""

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)


async def later(value: str, after_s: float) -> str:
    await asyncio.sleep(after_s)
    return value


def test_the_result_when_the_work_ends_first() -> None:
    async def run() -> None:
        gone = asyncio.Event()
        assert await unless_disconnected(request_gone_when(gone), later("done", 0.01)) == "done"
        gone.set()  # the client leaves after: nothing cancels this task now
        await asyncio.sleep(0.02)
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    asyncio.run(run())


def test_a_499_and_the_work_cancelled_when_the_client_goes_first() -> None:
    async def run() -> None:
        gone = asyncio.Event()
        cancelled = asyncio.Event()

        async def work() -> str:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "never"

        asyncio.get_running_loop().call_later(0.01, gone.set)
        with pytest.raises(APIError) as e:
            await unless_disconnected(request_gone_when(gone), work())
        assert e.value.status == CLIENT_CLOSED
        assert cancelled.is_set()
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await asyncio.sleep(0.01)  # and the task goes on uncancelled

    asyncio.run(run())


def test_a_disconnect_in_the_same_turn_as_the_result_cancels_nothing_later() -> None:
    """The watcher's callback may already be scheduled when the work's result comes: the task
    gets the result or the 499, and is never cancelled after unless_disconnected returned."""

    async def run() -> list[str]:
        outcomes = []
        for k in range(20):
            gone = asyncio.Event()
            loop = asyncio.get_running_loop()
            done: asyncio.Future[str] = loop.create_future()
            loop.call_later(0.002, gone.set)
            loop.call_later(0.002, done.set_result, "done")
            try:
                outcomes.append(await unless_disconnected(request_gone_when(gone), done))
            except APIError as e:
                outcomes.append(str(e.status))
            await asyncio.sleep(0.005 + 0.0001 * k)  # a stray cancel would land here
        return outcomes

    assert set(asyncio.run(run())) <= {"done", str(CLIENT_CLOSED)}


def test_a_cancel_from_elsewhere_is_not_turned_into_a_499() -> None:
    async def run() -> None:
        gone = asyncio.Event()
        task = asyncio.create_task(unless_disconnected(request_gone_when(gone), later("x", 10)))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
