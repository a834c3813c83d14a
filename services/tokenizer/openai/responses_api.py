"""POST /v1/responses: OpenAI's Responses API for text, whole or streamed.

The input (a string, or messages) is rendered with the chat template as a chat is, and one
generation runs. The answer is a response object with one output message; streamed, the
events OpenAI sends for a text answer: response.created, response.in_progress, the output
item and its content part added, one response.output_text.delta per step, their done events,
then response.completed (response.incomplete when max_output_tokens cut it, response.failed on
a pipeline error). Nothing is stored: previous_response_id is refused."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse

from services.tokenizer.errors import APIError, pipeline_status
from services.tokenizer.fanout import collect_all, first_items
from services.tokenizer.generation import FrontContext, Generation, Job, abandon, seeds, submit_all
from services.tokenizer.openai.responses_params import ResponsesRequest
from services.tokenizer.streaming import EventStream, sse
from shared.messages import FINISH_ERROR, FINISH_LENGTH


async def responses(ctx: FrontContext, body: ResponsesRequest, request: Request, arrival: float) -> Any:
    body.check()
    body.check_ids(ctx.vocab_size)
    try:
        _, ids = await ctx.tok.encode_chat(body.chat())
    except (ValueError, jinja2.TemplateError) as e:
        raise APIError(400, f"input: the chat template refused it: {e}", param="input") from e
    max_new = body.max_output_tokens or ctx.max_total_len - len(ids)
    if max_new < 1:
        raise APIError(400, f"input: {len(ids)} tokens, the model's limit is {ctx.max_total_len}", param="input")
    body.check_max_tokens(max_new, "max_output_tokens")
    (seed,) = seeds(body.seed, 1)
    job = Job(ids, body.sampling(seed, max_new, False, 0), body.stops(), bool(body.skip_special_tokens))
    gens = await submit_all(ctx, [job], arrival, "max_output_tokens", "input")
    shell = _Shell(ctx, body, len(ids))
    if body.stream:
        return await _stream(ctx, request, gens, shell)
    (out,) = await collect_all(ctx, gens, request)
    return JSONResponse(shell.response(out.text, out.finish_reason, out.output_tokens, out.cached_tokens))


class _Shell:
    """The parts of the response object that do not depend on the text."""

    def __init__(self, ctx: FrontContext, body: ResponsesRequest, prompt_tokens: int) -> None:
        self.id = "resp_" + secrets.token_hex(12)
        self.item_id = "msg_" + secrets.token_hex(12)
        self.created = int(time.time())
        self.ctx, self.body, self.prompt_tokens = ctx, body, prompt_tokens

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant", "content": content}

    def response(
        self, text: str | None, finish: str, output_tokens: int = 0, cached: int = 0, error: str = ""
    ) -> dict[str, Any]:
        """text None: not begun (no output yet); finish "": in progress."""
        status = {"": "in_progress", FINISH_LENGTH: "incomplete", FINISH_ERROR: "failed"}.get(finish, "completed")
        b = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.ctx.model_name,
            "output": [] if text is None else [self.message(text, "incomplete" if finish == FINISH_LENGTH else status)],
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "temperature": 1.0 if b.temperature is None else b.temperature,
            "top_p": 1.0 if b.top_p is None else b.top_p,
            "parallel_tool_calls": True,
            "tool_choice": "none",
            "tools": [],
            "text": {"format": b.format_echo()},
            "truncation": b.truncation or "disabled",
            "metadata": b.metadata or {},
            "incomplete_details": {"reason": "max_output_tokens"} if finish == FINISH_LENGTH else None,
            "error": {"code": "server_error", "message": error} if finish == FINISH_ERROR else None,
            "usage": None if not finish else self.usage(output_tokens, cached),
        }

    def usage(self, output_tokens: int, cached: int) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + output_tokens,
        }


async def _stream(ctx: FrontContext, request: Request, gens: list[Generation], shell: _Shell) -> EventStream:
    seq = iter(range(1 << 62))

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, "sequence_number": next(seq), **fields}, event=kind)

    where = {"item_id": shell.item_id, "output_index": 0, "content_index": 0}

    async def events() -> AsyncIterator[bytes]:
        async with contextlib.aclosing(stream):
            yield event("response.created", response=shell.response(None, ""))
            yield event("response.in_progress", response=shell.response(None, ""))
            yield event(
                "response.output_item.added", output_index=0, item=shell.message("", "in_progress") | {"content": []}
            )
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield event("response.content_part.added", **where, part=part)
            text, nxt = "", first
            while nxt is not None:
                _, item = nxt
                if item.finish_reason == FINISH_ERROR:
                    ctx.metrics.error(request.url.path, pipeline_status(item.error_kind))
                    failed = shell.response(text, FINISH_ERROR, error=f"generation failed: {item.error}")
                    yield event("response.failed", response=failed)
                    return
                if item.text:
                    text += item.text
                    yield event("response.output_text.delta", **where, delta=item.text, logprobs=[])
                if item.finish_reason:
                    yield event("response.output_text.done", **where, text=text, logprobs=[])
                    yield event("response.content_part.done", **where, part=part | {"text": text})
                    status = "incomplete" if item.finish_reason == FINISH_LENGTH else "completed"
                    yield event("response.output_item.done", output_index=0, item=shell.message(text, status))
                    done = shell.response(text, item.finish_reason, item.output_tokens, gens[0].cached_tokens)
                    yield event(f"response.{done['status']}", response=done)
                    return
                nxt = await anext(stream, None)

    response = EventStream(events(), on_close=lambda: abandon(ctx, gens), first_ready=True)
    stream, first = await first_items(ctx, gens, request, coalesce=True)
    return response
