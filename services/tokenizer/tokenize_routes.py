"""POST /tokenize and POST /detokenize in vLLM's shapes.

/tokenize takes {"prompt": str, "add_special_tokens": true} or {"messages": [...],
"add_generation_prompt": true, "add_special_tokens": false, "chat_template_kwargs": {...}}
(the chat template writes any BOS itself) and answers {"count", "max_model_len", "tokens"}, with "token_strs" when
return_token_strs is true. /detokenize takes {"tokens": [int]} and answers {"prompt"}.
"model", when given, must name the model served.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.tokenizer.errors import APIError, parse_json, parsed_body
from services.tokenizer.generation import FrontContext
from services.tokenizer.limits import check_token_ids
from services.tokenizer.openai.chat_params import ChatMessage
from services.tokenizer.openai.routes import check_model


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None


class TokenizePrompt(_Body):
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # vLLM's: the last message left open (needs add_generation_prompt false)
    add_special_tokens: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None

    def chat(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]


class Detokenize(_Body):
    tokens: list[int]


def _tokenize_body(raw: bytes) -> TokenizePrompt | TokenizeChat:
    """Prompt or messages, told apart by which one the body has."""
    try:
        keys = parse_json(raw)
    except ValueError:
        keys = None  # pydantic's error below says what is wrong with the JSON
    if isinstance(keys, dict) and "prompt" in keys and "messages" in keys:
        raise APIError(400, "prompt, messages: give one of them, not both", param="prompt")
    if isinstance(keys, dict) and "prompt" not in keys and "messages" not in keys:
        raise APIError(400, "prompt or messages: one of them is required", param="prompt")
    if isinstance(keys, dict) and "messages" in keys:
        return TokenizeChat.model_validate_json(raw)
    return TokenizePrompt.model_validate_json(raw)


async def _tokens(ctx: FrontContext, body: TokenizePrompt | TokenizeChat) -> list[int]:
    if isinstance(body, TokenizePrompt):
        return await ctx.tok.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    try:
        text = await asyncio.to_thread(
            ctx.tok.render_chat,
            body.chat(),
            body.add_generation_prompt,
            body.chat_template_kwargs,
            None,
            body.continue_final_message,
        )
    except (ValueError, jinja2.TemplateError) as e:
        raise APIError(400, f"messages: the chat template refused them: {e}", param="messages") from e
    return await ctx.tok.encode(text, add_special_tokens=body.add_special_tokens)


def tokenize_router(ctx: FrontContext) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await parsed_body(request, _tokenize_body)
        if body.model is not None:
            check_model(ctx, body.model)
        ids = await _tokens(ctx, body)
        out: dict[str, Any] = {"count": len(ids), "max_model_len": ctx.max_total_len, "tokens": ids}
        if body.return_token_strs:
            out["token_strs"] = ctx.tok.hf.convert_ids_to_tokens(ids)
        return JSONResponse(out)

    @router.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await parsed_body(request, Detokenize.model_validate_json)
        if body.model is not None:
            check_model(ctx, body.model)
        check_token_ids(body.tokens, ctx.vocab_size, "tokens")
        return JSONResponse({"prompt": await ctx.tok.decode(body.tokens)})

    return router
