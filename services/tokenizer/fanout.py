"""The generations of one HTTP request, waited on as one, and the client's disconnect.

``merged`` yields (index, item) from all of them as items arrive, reading the request's one
queue that the pipeline's reply task fills; closing it, the client going away while a
route waits, or the request's deadline passing abandons (aborts) every generation not yet
ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from typing import TypeVar

from starlette.requests import Request

from services.tokenizer.collected import Collected
from services.tokenizer.errors import CLIENT_CLOSED, APIError, pipeline_error
from services.tokenizer.generation import FrontContext, Generation, abandon, accept, deadline_s, expire
from shared.messages import FINISH_ERROR, TextItem

T = TypeVar("T")


async def merged(
    ctx: FrontContext, gens: list[Generation], coalesce: bool = False
) -> AsyncIterator[tuple[int, TextItem]]:
    """Every generation's items as they come, tagged with the generation's index. With
    coalesce, the items of one generation that queued up while the consumer was busy (a client
    reading slower than the worker steps) come as one: the stream sends fewer, larger chunks
    under load instead of falling further behind, and one chunk a step when it keeps up."""
    queue = gens[0].pending.queue  # shared by the request's generations (generation.submit_all)
    timer = asyncio.get_running_loop().call_later(deadline_s(ctx), expire, ctx, gens)
    left = len(gens)
    try:
        while left:
            ready = [await queue.get()]
            while coalesce and not queue.empty():
                ready.append(queue.get_nowait())
            ready = [(i, item) for i, item in ready if accept(ctx, gens[i], item)]
            for i, item in _joined(ready) if coalesce else ready:
                if item.finish_reason:
                    left -= 1
                yield i, item
    finally:
        # no await here: this may run inside a cancelled task
        timer.cancel()
        abandon(ctx, gens)


def _joined(ready: list[tuple[int, TextItem]]) -> list[tuple[int, TextItem]]:
    """One item per generation for consecutive items of it (an error stays on its own, so
    the text before it is still sent)."""
    out: list[tuple[int, TextItem]] = []
    last: dict[int, int] = {}  # generation -> its position in out
    for i, item in ready:
        k = last.get(i)
        if k is None or item.finish_reason == FINISH_ERROR or out[k][1].finish_reason:
            last[i] = len(out)
            out.append((i, item))
            continue
        a = out[k][1]
        joined = replace(
            item,
            text=a.text + item.text,
            token_ids=a.token_ids + item.token_ids,
            logprobs=a.logprobs + item.logprobs,
            top_logprobs=a.top_logprobs + item.top_logprobs,
            prompt_logprobs=a.prompt_logprobs or item.prompt_logprobs,  # the first token's item has them
            prompt_top_logprobs=a.prompt_top_logprobs or item.prompt_top_logprobs,
            prompt_ranks=a.prompt_ranks or item.prompt_ranks,
        )
        out[k] = (i, joined)
    return out


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """The result of work, or a 499 APIError (work cancelled) if the client goes away first.

    The work is awaited in the caller's own task, and a watcher task cancels that task if the
    client goes; the watcher is cancelled, not awaited, when the work ends first. So the
    result is back one turn of the loop after it is ready: a task of its own for the work and
    asyncio.wait around both took three more turns, which a lone request's first chunk paid.
    """
    task = asyncio.current_task()
    assert task is not None
    waiting, gone = True, False

    def on_gone(watcher: asyncio.Task[None]) -> None:
        nonlocal gone
        # a callback already scheduled when the work ended still runs: it must not cancel the task
        if waiting and not watcher.cancelled() and watcher.exception() is None:
            gone = True
            task.cancel()

    watcher = asyncio.create_task(_wait_disconnect(request))
    watcher.add_done_callback(on_gone)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        task.uncancel()
        raise APIError(CLIENT_CLOSED, "client disconnected", "client_closed") from None
    finally:
        waiting = False
        watcher.cancel()


async def collect_all(ctx: FrontContext, gens: list[Generation], request: Request) -> list[Collected]:
    """Run every generation to its end; an error in any ends the request with that error's
    status, and the client going away aborts them all at once."""

    async def run() -> list[Collected]:
        got = [Collected(prompt_tokens=g.pending.prompt_tokens) for g in gens]
        async with contextlib.aclosing(merged(ctx, gens)) as stream:
            async for i, item in stream:
                if item.finish_reason == FINISH_ERROR:
                    raise pipeline_error(item.error, item.error_kind)
                got[i].add(item)
        return got

    try:
        return await unless_disconnected(request, run())
    finally:
        abandon(ctx, gens)  # also when run() was cancelled before it began


async def first_items(
    ctx: FrontContext, gens: list[Generation], request: Request, coalesce: bool = False
) -> tuple[AsyncIterator[tuple[int, TextItem]], tuple[int, TextItem]]:
    """Open a stream and wait for its first item before any byte is sent, so that a request
    the pipeline refuses at once (overloaded, too large) gets a proper status code."""
    stream = merged(ctx, gens, coalesce)
    try:
        first = await unless_disconnected(request, anext(stream))
        _, item = first
        if item.finish_reason == FINISH_ERROR:
            raise pipeline_error(item.error, item.error_kind)
    except BaseException:
        abandon(ctx, gens)  # also when the stream was cancelled before it began
        await stream.aclose()
        raise
    return stream, first


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
