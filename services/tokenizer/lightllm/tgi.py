"""TGI's routes: POST / (a list of one generation, or a stream when "stream" is true),
/generate and /generate_stream when the body is TGI's (lightllm/routes.py tells), and
GET /info."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import metadata

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.tokenizer.collected import best
from services.tokenizer.errors import APIError, pipeline_status
from services.tokenizer.fanout import collect_all, first_items
from services.tokenizer.generation import FrontContext, Generation, Job, abandon, seeds, submit_all
from services.tokenizer.lightllm.tgi_params import TGIRequest
from services.tokenizer.lightllm.tgi_responses import TGIStream, generate_response
from services.tokenizer.limits import MAX_N, MAX_STOPS
from services.tokenizer.streaming import EventStream
from shared.messages import FINISH_ERROR


class TGIRoutes:
    def __init__(self, ctx: FrontContext) -> None:
        self.ctx = ctx

    async def _start(self, body: TGIRequest, arrival: float) -> tuple[list[int], list[int], list[Generation]]:
        ctx, p = self.ctx, body.params
        ids = await ctx.tok.encode(body.inputs)
        if p.truncate is not None:
            ids = ids[-p.truncate :]
        max_new = p.max_new_tokens if p.max_new_tokens is not None else ctx.max_total_len - len(ids)
        if max_new < 1:
            raise APIError(
                400,
                f"inputs: {len(ids)} tokens, the model's limit is {ctx.max_total_len}",
                "validation",
                param="inputs",
            )
        all_seeds = seeds(p.seed, p.sequences)
        jobs = [Job(ids, p.sampling(s, max_new), list(p.stop or []), True) for s in all_seeds]
        return ids, all_seeds, await submit_all(ctx, jobs, arrival, "parameters.max_new_tokens", "inputs")

    async def _generated(self, request: Request, body: TGIRequest, arrival: float) -> dict:
        ids, all_seeds, gens = await self._start(body, arrival)
        outs = await collect_all(self.ctx, gens, request)
        chosen = outs.index(best(outs, 1)[0])
        return generate_response(outs, chosen, body.params, all_seeds, (body.inputs, ids), self.ctx.tok)

    async def generate(self, request: Request, body: TGIRequest, arrival: float) -> JSONResponse:
        return JSONResponse(await self._generated(request, body, arrival))

    async def generate_stream(self, request: Request, body: TGIRequest, arrival: float) -> EventStream:
        ctx, p = self.ctx, body.params
        if p.sequences > 1:  # as TGI: best_of cannot stream
            raise APIError(400, "parameters.best_of: must be 1 when streaming", param="parameters.best_of")
        _, all_seeds, gens = await self._start(body, arrival)
        shape = TGIStream(p, all_seeds[0], body.inputs, ctx.tok)
        route = request.url.path

        async def events() -> AsyncIterator[bytes]:
            async with contextlib.aclosing(stream):
                nxt: tuple | None = first
                while nxt is not None:
                    item = nxt[1]
                    if item.finish_reason == FINISH_ERROR:
                        ctx.metrics.error(route, pipeline_status(item.error_kind))
                    for event in shape.events(item):
                        yield event
                    nxt = await anext(stream, None)

        response = EventStream(events(), on_close=lambda: abandon(ctx, gens), first_ready=True)  # before the wait
        stream, first = await first_items(ctx, gens, request)
        return response

    async def root(self, request: Request, body: TGIRequest, arrival: float) -> JSONResponse | EventStream:
        """TGI's POST /: a stream, or a list of one generation (as the Inference API answers)."""
        if body.stream:
            return await self.generate_stream(request, body, arrival)
        return JSONResponse([await self._generated(request, body, arrival)])


def tgi_router(ctx: FrontContext) -> APIRouter:
    router = APIRouter()

    @router.get("/info")
    async def info() -> JSONResponse:
        """TGI's /info, with what this front end knows of the model."""
        try:
            version = metadata.version("lightstream")
        except metadata.PackageNotFoundError:
            version = "unknown"
        return JSONResponse(
            {
                "model_id": ctx.model_name,
                "model_sha": None,
                "model_dtype": None,
                "model_device_type": None,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": None,
                "max_best_of": MAX_N,
                "max_stop_sequences": MAX_STOPS,
                "max_input_tokens": ctx.max_total_len - 1,
                "max_total_tokens": ctx.max_total_len,
                "validation_workers": ctx.cfg.tokenizer_threads,
                "max_client_batch_size": 1,
                "router": "lightstream",
                "version": version,
                "sha": None,
                "docker_label": None,
            }
        )

    return router
