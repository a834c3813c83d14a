"""Anthropic's routes: POST /v1/messages (post_routes.py, as the routes that generate are) and
POST /v1/messages/count_tokens (FastAPI's, as /tokenize is: it generates nothing).

Errors under /v1/messages have Anthropic's body (errors.py picks it by path); ``model`` must
be the served name, as on the OpenAI routes (404 otherwise).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from services.tokenizer.anthropic.messages import messages
from services.tokenizer.anthropic.params import CountTokensRequest, MessagesRequest
from services.tokenizer.anthropic.prompt import render
from services.tokenizer.errors import parsed_body
from services.tokenizer.generation import FrontContext
from services.tokenizer.openai.routes import check_model
from services.tokenizer.post_routes import PostRoute


def anthropic_post_routes(ctx: FrontContext) -> dict[str, PostRoute]:
    async def messages_route(request: Request, body: MessagesRequest, arrival: float) -> Response:
        check_model(ctx, body.model)
        return await messages(ctx, body, request, arrival)

    return {"/v1/messages": PostRoute(MessagesRequest, messages_route, "Anthropic messages")}


def anthropic_router(ctx: FrontContext) -> APIRouter:
    router = APIRouter(prefix="/v1/messages")

    @router.post("/count_tokens")
    async def count_tokens(request: Request) -> JSONResponse:
        """The prompt's tokens as /v1/messages renders it (images' positions included)."""
        body = await parsed_body(request, CountTokensRequest.model_validate_json)
        check_model(ctx, body.model)
        prompt = await render(ctx, body)
        return JSONResponse({"input_tokens": len(prompt.ids)})

    return router
