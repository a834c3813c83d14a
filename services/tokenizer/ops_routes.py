"""What operators and their tools ask of the front end: GET /readiness (ready to take
requests), GET /liveness (the process answers: what an orchestrator restarts on) and
GET /version."""

from __future__ import annotations

import functools
import importlib.metadata
import pathlib
import tomllib

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.tokenizer.drain import Drain
from services.tokenizer.generation import FrontContext

PACKAGE = "lightstream"
PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


@functools.cache
def package_version() -> str:
    """The installed package's version; in a checkout run without installing, pyproject's."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def not_ready_because(ctx: FrontContext, drain: Drain) -> list[str]:
    """Why the front end cannot take a request now; empty when it can."""
    live = ctx.pipeline.live
    why = []
    if drain.draining:
        why.append("the server is shutting down (draining)")
    if not live.redis:
        why.append("redis is unreachable")
    if not live.workers:
        why.append("no worker group is alive")
    if not live.detoks:
        why.append("no detokenizer is alive")
    if not live.routers:
        why.append("the router is not alive")
    if ctx.images.vision is not None and not live.visuals:
        why.append("no visual replica is alive (the model's images are encoded there)")
    return why


def ops_router(ctx: FrontContext, drain: Drain) -> APIRouter:
    router = APIRouter()

    @router.get("/readiness")
    async def readiness() -> JSONResponse:
        why = not_ready_because(ctx, drain)
        if not why:
            return JSONResponse({"status": "ready"})
        status = "draining" if drain.draining else "unavailable"
        return JSONResponse({"status": status, "reasons": why}, status_code=503, headers={"Retry-After": "1"})

    @router.get("/liveness")
    async def liveness() -> JSONResponse:
        # 200 whatever the other services do and while draining: a restart of this process
        # would bring no worker back (/health, 503 without one, is the wrong probe for that)
        return JSONResponse({"status": "alive"})

    @router.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": package_version(), "model": ctx.model_name})

    return router
