"""OpenAI's routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions.

Errors under /v1 use OpenAI's body (errors.py picks it by path).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from services.tokenizer.errors import APIError
from services.tokenizer.generation import FrontContext
from services.tokenizer.openai_chat import chat_completions
from services.tokenizer.openai_completions import completions
from services.tokenizer.openai_params import ChatCompletionRequest, CompletionRequest
from services.tokenizer.streaming import EventStream


def check_model(ctx: FrontContext, model: str) -> None:
    if model != ctx.model_name:
        raise APIError(
            404,
            f"the model {model!r} does not exist; this server serves {ctx.model_name!r}",
            "model_not_found",
            None,
            "model",
        )


def openai_router(ctx: FrontContext) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def models() -> JSONResponse:
        card = {
            "id": ctx.model_name,
            "object": "model",
            "created": int(ctx.started),
            "owned_by": "lightstream",
            "max_model_len": ctx.max_total_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @router.post("/completions", response_model=None)
    async def completions_route(body: CompletionRequest, request: Request) -> JSONResponse | EventStream:
        arrival = time.monotonic()
        check_model(ctx, body.model)
        return await completions(ctx, body, request, arrival)

    @router.post("/chat/completions", response_model=None)
    async def chat_route(body: ChatCompletionRequest, request: Request) -> JSONResponse | EventStream:
        arrival = time.monotonic()
        check_model(ctx, body.model)
        return await chat_completions(ctx, body, request, arrival)

    return router
