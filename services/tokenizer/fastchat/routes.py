"""FastChat's model-worker routes (all POST): /worker_get_status, /count_token,
/model_details, /worker_get_conv_template, /worker_generate_stream, /worker_generate.

Generation goes through generation.py and fanout.py as on every other route: stop strings
are cut and their possible starts held back by the detokenizer, a caller that goes away
aborts the generation, and the worker frees its KV at its next step. Each request holds
one of the worker's concurrency slots (worker.Slots) from before it is submitted
until its response ends, however it ends. The two that generate are served by
post_routes.py, the rest by FastAPI.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from services.tokenizer.collected import best
from services.tokenizer.errors import APIError, describe_validation, parse_json, pipeline_status
from services.tokenizer.fanout import collect_all, first_items, unless_disconnected
from services.tokenizer.fastchat.chunks import Progress, encode, error_chunk, failed_chunk
from services.tokenizer.fastchat.params import WorkerParams
from services.tokenizer.fastchat.worker import FastChatWorker, Slot
from services.tokenizer.generation import (
    FrontContext,
    Generation,
    Job,
    abandon,
    seeds,
    submit_all,
)
from services.tokenizer.limits import check_token_ids
from services.tokenizer.post_routes import PostRoute
from services.tokenizer.streaming import EventStream
from shared.messages import FINISH_ERROR, TextItem


class WorkerStream(EventStream):
    """JSON chunks each followed by a NUL byte, as FastChat's workers stream them. Like
    EventStream it cancels its body the moment the caller goes away and then runs on_close;
    it has no media type, as FastChat's own workers' streams."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(content, on_close, media_type=None)


def fastchat_post_routes(worker: FastChatWorker) -> dict[str, PostRoute]:
    """The two routes that generate (post_routes.py); they read their bodies themselves, as
    FastChat's parameters are checked in two steps (params.py)."""

    async def generate_stream(request: Request, _: None, arrival: float) -> Response:
        return await _generate_stream(worker, request, arrival)

    async def generate(request: Request, _: None, arrival: float) -> JSONResponse:
        return await _generate(worker, request, arrival)

    return {
        "/worker_generate_stream": PostRoute(None, generate_stream, "FastChat worker: stream", WorkerParams),
        "/worker_generate": PostRoute(None, generate, "FastChat worker: whole answer", WorkerParams),
    }


async def _start(
    worker: FastChatWorker, request: Request, stream: bool, arrival: float
) -> tuple[WorkerParams, Slot, list[int], list[Generation]]:
    """Parse, take a slot, submit; the slot is released here if anything fails."""
    ctx = worker.ctx
    params = await _params(request)
    check_token_ids(params.stop_token_ids or [], ctx.vocab_size, "stop_token_ids")
    if stream and params.sequences > 1:
        raise APIError(400, "best_of: a stream returns one sequence, must be 1", param="best_of")
    slot = await unless_disconnected(request, worker.slots.take())
    try:
        images = await ctx.images.load(params.image_sources())
        ids, prompt_images = ctx.images.expand(await ctx.tok.encode(params.prompt), images, "prompt")
        jobs = [
            Job(ids, params.sampling(seed), params.stops(), True, prompt_images)
            for seed in seeds(None, params.sequences)
        ]
        gens = await submit_all(ctx, jobs, arrival, "max_new_tokens", "prompt")
    except BaseException:
        slot.release()
        raise
    return params, slot, ids, gens


async def _generate_stream(worker: FastChatWorker, request: Request, arrival: float) -> Response:
    """/worker_generate_stream: the text so far after every item; the slot is held until the stream ends."""
    ctx = worker.ctx
    try:
        params, slot, ids, gens = await _start(worker, request, True, arrival)
    except APIError as e:
        return Response(encode(error_chunk(e)))
    try:
        stream, first = await first_items(ctx, gens, request)
    except APIError as e:
        slot.release()
        return Response(encode(error_chunk(e)))
    except BaseException:
        slot.release()
        raise
    progress = Progress.start(params.prompt, params.echo, ids, ctx.tok, params.logprobs)

    def close() -> None:
        abandon(ctx, gens)
        slot.release()

    return WorkerStream(_chunks(ctx, stream, first, progress, request.url.path), on_close=close)


async def _chunks(
    ctx: FrontContext,
    stream: AsyncIterator[tuple[int, TextItem]],
    first: tuple[int, TextItem],
    progress: Progress,
    route: str,
) -> AsyncIterator[bytes]:
    """One generation's items as FastChat's cumulative chunks, ending at its finish or error."""
    async with contextlib.aclosing(stream):
        nxt: tuple[int, TextItem] | None = first
        while nxt is not None:
            item = nxt[1]
            if item.finish_reason == FINISH_ERROR:
                ctx.metrics.error(route, pipeline_status(item.error_kind))
                yield encode(failed_chunk(item))
                return
            if progress.add(item):
                yield encode(progress.chunk())
            if item.finish_reason:  # the final text once more, with its finish reason
                yield encode(progress.chunk(item.finish_reason))
            nxt = await anext(stream, None)


async def _generate(worker: FastChatWorker, request: Request, arrival: float) -> JSONResponse:
    """/worker_generate: the last chunk /worker_generate_stream would send; with best_of, of the best sequence."""
    ctx = worker.ctx
    try:
        params, slot, ids, gens = await _start(worker, request, False, arrival)
    except APIError as e:
        return JSONResponse(error_chunk(e))
    try:
        chosen = best(await collect_all(ctx, gens, request), 1)[0]
    except APIError as e:
        return JSONResponse(error_chunk(e))
    finally:
        slot.release()
    progress = Progress.start(params.prompt, params.echo, ids, ctx.tok, params.logprobs)
    progress.add(chosen)
    return JSONResponse(progress.chunk(chosen.finish_reason))


def fastchat_router(worker: FastChatWorker) -> APIRouter:
    """FastChat's other worker routes: status, token count, model details, conversation template."""
    ctx = worker.ctx
    router = APIRouter()

    @router.post("/worker_get_status")
    async def get_status() -> JSONResponse:
        return JSONResponse(worker.status())

    @router.post("/count_token")
    async def count_token(request: Request) -> JSONResponse:
        try:
            body = await _json(request)
        except APIError as e:
            return JSONResponse(error_chunk(e))
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not isinstance(prompt, str):
            return JSONResponse(error_chunk(APIError(400, "prompt: required, a string", "validation")))
        # counted as generation tokenizes it, so FastChat's length check matches ours
        return JSONResponse({"count": len(await ctx.tok.encode(prompt)), "error_code": 0})

    @router.post("/model_details")
    async def model_details() -> JSONResponse:
        return JSONResponse({"context_length": ctx.max_total_len})

    @router.post("/worker_get_conv_template")
    async def conv_template() -> JSONResponse:
        return JSONResponse({"conv": worker.conv})

    return router


async def _json(request: Request) -> object:
    try:
        return parse_json(await request.body())
    except ValueError as e:
        raise APIError(400, f"the request body is not valid JSON ({e})", "validation") from e


async def _params(request: Request) -> WorkerParams:
    body = await _json(request)
    try:
        return WorkerParams.model_validate(body)
    except ValidationError as e:
        raise APIError(400, describe_validation(list(e.errors())), "validation") from e
