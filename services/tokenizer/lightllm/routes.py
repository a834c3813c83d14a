"""LightLLM's routes: POST /generate and POST /generate_stream, which serve TGI's body in
TGI's shapes when the body is TGI's (tgi_params.is_tgi), and TGI's POST / (tgi.py); all
served by post_routes.py."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from services.tokenizer.collected import best
from services.tokenizer.errors import APIError, parse_json, pipeline_status
from services.tokenizer.fanout import collect_all, first_items
from services.tokenizer.generation import (
    FrontContext,
    Generation,
    Job,
    abandon,
    seeds,
    submit_all,
)
from services.tokenizer.lightllm.params import GenerateBody
from services.tokenizer.lightllm.responses import generate_response, stream_events
from services.tokenizer.lightllm.tgi import TGIRoutes
from services.tokenizer.lightllm.tgi_params import TGIRequest, is_tgi
from services.tokenizer.limits import check_token_ids
from services.tokenizer.post_routes import Handler, PostRoute
from services.tokenizer.streaming import EventStream
from shared.messages import FINISH_ERROR


def lightllm_post_routes(ctx: FrontContext) -> dict[str, PostRoute]:
    async def start(body: GenerateBody, arrival: float) -> list[Generation]:
        p = body.parameters
        check_token_ids(p.stop_token_ids or [], ctx.vocab_size, "parameters.stop_token_ids")
        images = await ctx.images.load(body.image_sources())
        ids, prompt_images = ctx.images.expand(await ctx.tok.encode(body.inputs), images, "inputs")
        jobs = [
            Job(ids, p.sampling(s), p.stops(), p.skip_special_tokens, prompt_images) for s in seeds(p.seed, p.sequences)
        ]
        return await submit_all(ctx, jobs, arrival)

    async def generate(request: Request, body: GenerateBody, arrival: float) -> JSONResponse:
        gens = await start(body, arrival)
        outs = await collect_all(ctx, gens, request)
        chosen = best(outs, body.parameters.n)
        # the first generation's cached tokens, as in OpenAI's usage (docs/api.md)
        return JSONResponse(generate_response(chosen, body.parameters.return_details, ctx.tok, outs[0].cached_tokens))

    async def generate_stream(request: Request, body: GenerateBody, arrival: float) -> EventStream:
        p = body.parameters
        if p.sequences > 1:  # as LightLLM: one stream carries one sequence
            name = "n" if p.n > 1 else "best_of"
            raise APIError(
                400, f"parameters.{name}: streaming returns one sequence, must be 1", param=f"parameters.{name}"
            )
        gens = await start(body, arrival)
        details = p.return_details
        route = request.url.path

        async def events() -> AsyncIterator[bytes]:
            async with contextlib.aclosing(stream):
                item = first[1]
                while True:
                    if item.finish_reason == FINISH_ERROR:
                        ctx.metrics.error(route, pipeline_status(item.error_kind))
                    for event in stream_events(item, details, ctx.tok):
                        yield event
                    nxt = await anext(stream, None)
                    if nxt is None:
                        return
                    item = nxt[1]

        response = EventStream(events(), on_close=lambda: abandon(ctx, gens), first_ready=True)  # before the wait
        stream, first = await first_items(ctx, gens, request)
        return response

    tgi = TGIRoutes(ctx)

    return {
        "/generate": PostRoute(
            None, dialect(generate, tgi.generate), "LightLLM's generate (TGI's when the body is TGI's)", GenerateBody
        ),
        "/generate_stream": PostRoute(
            None,
            dialect(generate_stream, tgi.generate_stream),
            "LightLLM's generate_stream (TGI's when the body is TGI's)",
            GenerateBody,
        ),
        "/": PostRoute(TGIRequest, tgi.root, "TGI's generate (stream: true streams)"),
    }


def dialect(lightllm: Handler, tgi_handler: Handler) -> Handler:
    """/generate and /generate_stream: TGI's body to TGI's handler, LightLLM's to LightLLM's."""

    async def handle(request: Request, _: None, arrival: float) -> JSONResponse | EventStream:
        raw = await request.body()
        try:
            tgi_body = is_tgi(parse_json(raw))
        except ValueError:  # not JSON: LightLLM's model says so, as before
            tgi_body = False
        if tgi_body:
            return await tgi_handler(request, TGIRequest.model_validate_json(raw), arrival)
        return await lightllm(request, GenerateBody.model_validate_json(raw), arrival)

    return handle
