"""The front end's ASGI application: gates, the drain's gate, the routes that generate, and
FastAPI for the rest (its routes and error handlers, /health, /readiness, /liveness, /version,
/tokenize, /detokenize, /v1/messages/count_tokens and /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp

from services.tokenizer.anthropic.routes import anthropic_post_routes, anthropic_router
from services.tokenizer.drain import Drain, DrainGate
from services.tokenizer.errors import APIError, api_error_handler, validation_handler
from services.tokenizer.fastchat.registration import start_registration
from services.tokenizer.fastchat.routes import fastchat_post_routes, fastchat_router
from services.tokenizer.fastchat.worker import FastChatWorker
from services.tokenizer.gates import Gates, open_paths
from services.tokenizer.generation import FrontContext
from services.tokenizer.lightllm.routes import lightllm_post_routes
from services.tokenizer.lightllm.tgi import tgi_router
from services.tokenizer.metrics import CONTENT_TYPE, CountRequests
from services.tokenizer.openai.routes import openai_post_routes, openai_router
from services.tokenizer.openapi_doc import document_post_routes
from services.tokenizer.ops_routes import ops_router
from services.tokenizer.post_routes import PostRoutes
from services.tokenizer.tokenize_routes import tokenize_router


def create_app(ctx: FrontContext, drain: Drain | None = None) -> ASGIApp:
    fastchat = FastChatWorker(ctx)
    drain = drain or Drain(ctx.cfg.drain_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        drain.loop = asyncio.get_running_loop()
        ctx.pipeline.start(drain.loop)
        registration = start_registration(fastchat)  # None without --fastchat-controller
        yield
        if registration is not None:
            registration.cancel()
        ctx.pipeline.stop()
        ctx.tok.shutdown()

    app = FastAPI(title="LightStream", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, validation_handler)
    app.add_exception_handler(APIError, api_error_handler)
    app.include_router(openai_router(ctx))
    app.include_router(anthropic_router(ctx))
    app.include_router(fastchat_router(fastchat))
    app.include_router(tgi_router(ctx))
    app.include_router(ops_router(ctx, drain))
    app.include_router(tokenize_router(ctx))

    @app.get("/health")
    async def health() -> JSONResponse:  # liveness (and the services seen); /readiness also says no while draining
        live = ctx.pipeline.live
        vision = ctx.images.vision is not None  # its images are encoded by a visual replica
        ready = live.ready and (bool(live.visuals) or not vision)
        body = {
            "status": "ok" if ready else "unavailable",
            "redis": "ok" if live.redis else "unreachable",
            "workers": sorted(live.workers),
            "detokenizers": sorted(live.detoks),
            "routers": sorted(live.routers),
        }
        if vision:
            body["visual_replicas"] = sorted(live.visuals)
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)

    # outside FastAPI, so that a request that generates passes no layer it does not need (its
    # routing, its error middleware's wrap of every send): count every request, then the gates
    # may refuse it, then the drain's gate (a 503 while draining, else counted in flight),
    # then the routes that generate are served; the rest go on to FastAPI
    post = {
        **openai_post_routes(ctx),
        **anthropic_post_routes(ctx),
        **lightllm_post_routes(ctx),
        **fastchat_post_routes(fastchat),
    }
    document_post_routes(app, post)
    drained = DrainGate(PostRoutes(app, routes=post), drain, paths=post)
    keys = ctx.cfg.api_keys
    gated = Gates(drained, ctx.cfg.max_body_bytes, keys, open_paths(ctx.cfg.protect_metrics), ctx.cfg.body_timeout_s)
    return CountRequests(gated, metrics=ctx.metrics)
