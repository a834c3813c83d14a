"""OpenAI's routes: GET /v1/models (FastAPI's), POST /v1/completions and POST
/v1/chat/completions (post_routes.py).

Errors under /v1 use OpenAI's body (errors.py picks it by path).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from services.tokenizer.errors import APIError
from services.tokenizer.generation import FrontContext
from services.tokenizer.openai.chat import chat_completions
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.completions import completions
from services.tokenizer.openai.params import CompletionRequest
from services.tokenizer.openai.responses_api import responses
from services.tokenizer.openai.responses_params import ResponsesRequest
from services.tokenizer.post_routes import PostRoute


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

    return router


def openai_post_routes(ctx: FrontContext) -> dict[str, PostRoute]:
    async def completions_route(request: Request, body: CompletionRequest, arrival: float) -> Response:
        check_model(ctx, body.model)
        return await completions(ctx, body, request, arrival)

    async def chat_route(request: Request, body: ChatCompletionRequest, arrival: float) -> Response:
        check_model(ctx, body.model)
        return await chat_completions(ctx, body, request, arrival)

    async def responses_route(request: Request, body: ResponsesRequest, arrival: float) -> Response:
        check_model(ctx, body.model)
        return await responses(ctx, body, request, arrival)

    return {
        "/v1/responses": PostRoute(ResponsesRequest, responses_route, "OpenAI responses (text)"),
        "/v1/completions": PostRoute(CompletionRequest, completions_route, "OpenAI completions"),
        "/v1/chat/completions": PostRoute(ChatCompletionRequest, chat_route, "OpenAI chat completions"),
    }
