"""LightLLM's routes: POST /generate, POST /generate_stream, and TGI's POST / that picks by "stream"."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from services.tokenizer.errors import pipeline_error
from services.tokenizer.generation import FrontContext, collect, items, new_seed, submit
from services.tokenizer.params import GenerateBody
from services.tokenizer.pipeline import PendingRequest
from services.tokenizer.responses import generate_response, stream_events
from shared.messages import FINISH_ERROR


def lightllm_router(ctx: FrontContext) -> APIRouter:
    router = APIRouter()

    async def start(body: GenerateBody) -> PendingRequest:
        p = body.parameters
        ids = await ctx.tok.encode(body.inputs)
        return await submit(ctx, ids, p.sampling(new_seed()), p.stops(), p.skip_special_tokens)

    @router.post("/generate")
    async def generate(body: GenerateBody, request: Request) -> JSONResponse:
        pending = await start(body)
        got = await collect(ctx, pending, request)
        if got.finish_reason == FINISH_ERROR:
            raise pipeline_error(got.error, got.error_kind)
        return JSONResponse(generate_response(got, body.parameters.return_details, ctx.tok))

    @router.post("/generate_stream")
    async def generate_stream(body: GenerateBody) -> StreamingResponse:
        pending = await start(body)
        details = body.parameters.return_details

        async def events() -> AsyncIterator[bytes]:
            async for item in items(ctx, pending):
                for event in stream_events(item, details, ctx.tok):
                    yield event

        return StreamingResponse(events(), media_type="text/event-stream")

    @router.post("/")
    async def tgi_compat(body: GenerateBody, request: Request):
        if body.stream:
            return await generate_stream(body)
        return await generate(body, request)

    return router
