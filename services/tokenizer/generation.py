"""One generation from the front end's side: check, submit, wait for text, clean up.

Every route (LightLLM, OpenAI, FastChat) goes through here, so limits, deadlines and
aborts on client disconnect behave the same everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from services.tokenizer.errors import APIError
from services.tokenizer.pipeline import PendingRequest, Pipeline, Unavailable
from services.tokenizer.responses import Collected
from services.tokenizer.tokenization import Tokenization
from shared.config import TokenizerConfig
from shared.log import request_id
from shared.messages import ERR_DEADLINE, FINISH_ERROR, SamplingParams, TextItem

log = logging.getLogger(__name__)


@dataclass
class FrontContext:
    cfg: TokenizerConfig
    pipeline: Pipeline
    tok: Tokenization
    max_total_len: int  # prompt + output tokens per request
    model_name: str


def new_seed() -> int:
    return secrets.randbits(63)


async def submit(
    ctx: FrontContext,
    prompt_ids: list[int],
    params: SamplingParams,
    stops: list[str],
    skip_special_tokens: bool,
    max_tokens_name: str = "max_new_tokens",
) -> PendingRequest:
    """Check the request against the model's limits and send it down the pipeline."""
    if not prompt_ids:
        raise APIError(400, "the prompt is empty: it has no tokens")
    total = len(prompt_ids) + params.max_new_tokens
    if total > ctx.max_total_len:
        raise APIError(
            400,
            f"the prompt has {len(prompt_ids)} tokens and {max_tokens_name} is {params.max_new_tokens}: "
            f"{total} tokens exceed the model's limit of {ctx.max_total_len}",
        )
    rid = uuid.uuid4().hex
    request_id.set(rid)
    deadline = time.time() + ctx.cfg.request_timeout_s
    try:
        pending = await ctx.pipeline.submit(rid, prompt_ids, params, stops, skip_special_tokens, deadline)
    except Unavailable as e:
        raise APIError(503, f"the service cannot take requests now: {e}", "unavailable", {"Retry-After": "1"}) from e
    log.info("submitted: prompt_tokens=%d max_new_tokens=%d", len(prompt_ids), params.max_new_tokens)
    return pending


async def items(ctx: FrontContext, pending: PendingRequest) -> AsyncIterator[TextItem]:
    """The request's text items until it ends; an explicit error item if its deadline passes."""
    deadline = time.monotonic() + ctx.cfg.request_timeout_s + 5.0
    try:
        while True:
            try:
                item = await asyncio.wait_for(pending.queue.get(), timeout=max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                ctx.pipeline.abort(pending.rid, "deadline exceeded")
                yield TextItem(
                    pending.rid,
                    "",
                    finish_reason=FINISH_ERROR,
                    error="deadline exceeded",
                    error_kind=ERR_DEADLINE,
                    prompt_tokens=pending.prompt_tokens,
                )
                return
            yield item
            if item.finish_reason:
                ctx.pipeline.done(pending.rid)
                return
    finally:
        # reached without an end: the consumer stopped early (client gone, cancelled)
        ctx.pipeline.abort(pending.rid, "client disconnected")


async def collect(ctx: FrontContext, pending: PendingRequest, request: Request) -> Collected:
    """Run a request to its end; abort it at once if the client disconnects first."""
    watcher = asyncio.create_task(_wait_disconnect(request))
    got = Collected(prompt_tokens=pending.prompt_tokens)
    try:
        async for item in _until(items(ctx, pending), watcher):
            got.add(item)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return got


async def _until(source: AsyncIterator[TextItem], watcher: asyncio.Task) -> AsyncIterator[TextItem]:
    """Items of source, stopping (and closing source) as soon as the watcher task ends."""
    it = source.__aiter__()
    try:
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if nxt not in done:
                nxt.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await nxt
                raise APIError(499, "client disconnected", "client_closed")
            try:
                yield nxt.result()
            except StopAsyncIteration:
                return
    finally:
        await it.aclose()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
