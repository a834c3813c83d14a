"""The front end's FastAPI application: routes, error handlers, body-size limit, health."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.responses import Response

from services.tokenizer.errors import APIError, api_error_handler, validation_handler
from services.tokenizer.generation import FrontContext
from services.tokenizer.lightllm_api import lightllm_router


class BodyLimit(BaseHTTPMiddleware):
    """Refuse bodies over the limit before reading them (by Content-Length) with a 413."""

    def __init__(self, app, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return JSONResponse(
                {"error": f"the request body is over {self.max_bytes} bytes", "error_type": "too_large"},
                status_code=413,
            )
        return await call_next(request)


def create_app(ctx: FrontContext) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import asyncio

        ctx.pipeline.start(asyncio.get_running_loop())
        yield
        ctx.pipeline.stop()
        ctx.tok.shutdown()

    app = FastAPI(title="LightStream", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, validation_handler)
    app.add_exception_handler(APIError, api_error_handler)
    app.add_middleware(BodyLimit, max_bytes=ctx.cfg.max_body_bytes)
    app.include_router(lightllm_router(ctx))

    @app.get("/health")
    async def health() -> JSONResponse:
        live = ctx.pipeline.live
        body = {
            "status": "ok" if live.ready else "unavailable",
            "workers": sorted(live.workers),
            "detokenizers": sorted(live.detoks),
            "routers": sorted(live.routers),
        }
        return JSONResponse(body, status_code=200 if live.ready else 503)

    return app
