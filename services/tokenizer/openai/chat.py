"""POST /v1/chat/completions: messages (and tools) rendered with the model's chat template, n
generations, whole or streamed; each answer read into thinking, content and tool calls
(chat_reader.py) as it streams."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse

from services.tokenizer.errors import APIError, failed_event
from services.tokenizer.fanout import collect_all, first_items
from services.tokenizer.generation import (
    FrontContext,
    Generation,
    Job,
    abandon,
    seeds,
    submit_all,
)
from services.tokenizer.openai import responses as shape
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.chat_reader import ChatReader, message
from services.tokenizer.openai.reasoning import END, START, ReasoningReader
from services.tokenizer.openai.stop_strings import StopEcho, stop_string_hit
from services.tokenizer.openai.tools import ToolPlan, tool_plan
from services.tokenizer.streaming import EventStream, sse
from shared.messages import FINISH_ERROR, FINISH_STOP, Constraint


async def chat_completions(
    ctx: FrontContext, body: ChatCompletionRequest, request: Request, arrival: float
) -> JSONResponse | EventStream:
    body.check()
    body.check_ids(ctx.vocab_size)
    plan = tool_plan(body.tools, body.tool_choice, ctx.cfg.tool_call_parser, body.parallel_tool_calls)
    images = await ctx.images.load(body.image_sources())
    try:
        _, ids = await ctx.tok.encode_chat(body.chat(), body.chat_template_kwargs, plan.tools, **body.template_flags())
    except (ValueError, jinja2.TemplateError) as e:
        raise APIError(400, f"messages: the chat template refused them: {e}", param="messages") from e
    ids, prompt_images = ctx.images.expand(body.truncated_chat(ids, ctx.max_total_len, images), images, "messages")
    constraint = _answer_constraint(ctx, body, plan, ids)
    asked, name = body.max_tokens_asked()
    max_new = asked if asked is not None else ctx.max_total_len - len(ids)  # as OpenAI: up to the context
    if max_new < 1:
        of_images = f" ({prompt_images.tokens} of them its images')" if prompt_images is not None else ""
        raise APIError(
            400,
            f"messages: the rendered chat has {len(ids)} tokens{of_images}, the model's limit is {ctx.max_total_len}",
            "context_length_exceeded",
            param="messages",
        )
    body.check_max_tokens(max_new, name)
    k = body.top_logprobs or 0
    skip = bool(body.skip_special_tokens)
    jobs = [
        Job(ids, body.sampling(seed, max_new, bool(body.logprobs), k, constraint), body.stops(), skip, prompt_images)
        for seed in seeds(body.seed, body.sequences)
    ]
    gens = await submit_all(ctx, jobs, arrival, name, "messages")
    rid, created = gens[0].pending.rid.partition("-")[0], int(time.time())
    reader = functools.partial(_reader, ctx, plan, body)
    if body.stream:
        return await _stream(ctx, body, request, gens, rid, created, reader, ids)

    outs = await collect_all(ctx, gens, request)
    choices, names = [], body.token_names(ctx.tok)  # names: the logprobs' tokens' (texts or ids)
    for i, c in enumerate(outs):
        lp = shape.chat_logprobs(names, c.token_ids, c.logprobs, c.top_logprobs, k) if body.logprobs else None
        text = c.text
        if body.include_stop_str_in_output and c.finish_reason == FINISH_STOP:
            text += await stop_string_hit(ctx.tok, c.token_ids, c.text, body.stops(), skip)
        r = reader()
        msg = message(r.feed(text) + r.finish(), with_reasoning=r.reasoning is not None)
        choices.append(shape.chat_choice(i, msg, lp, _finish(c.finish_reason, r)) | body.token_ids(c.token_ids))
    use = shape.usage(len(ids), sum(c.output_tokens for c in outs), outs[0].cached_tokens)  # one prompt for n
    whole = shape.chat(rid, created, ctx.model_name, choices, use, chunk=False, usage_key=True)
    if body.return_token_ids:  # vLLM's: the rendered (and truncated) prompt's, as the model saw it
        whole["prompt_token_ids"] = ids
    if body.prompt_logprobs is not None:  # vLLM's, of the one prompt
        whole["prompt_logprobs"] = shape.vllm_prompt_logprobs(ctx.tok, ids, outs[0], body.prompt_logprobs)
    return JSONResponse(whole)


def _answer_constraint(
    ctx: FrontContext, body: ChatCompletionRequest, plan: ToolPlan, ids: list[int]
) -> Constraint | None:
    """What the answer is held to: a required or named tool call's grammar, or the format asked
    for; with a reasoning parser, from the end of the thinking on (unless the prompt ended it)."""
    asked = body.format_constraint()
    if plan.constraint is not None and asked is not None:
        raise APIError(
            400,
            "tool_choice: a required or named tool call fixes the answer's format; response_format and guided_* "
            "cannot be used with it",
            param="tool_choice",
        )
    return after_thinking(ctx, plan.constraint or asked, ids, "response_format")


def after_thinking(ctx: FrontContext, c: Constraint | None, ids: list[int], param: str) -> Constraint | None:
    """With a reasoning parser, the constraint c holds the answer from the end of the thinking
    on (unless the prompt ids ended it already); param: what asked for c, for the error."""
    if c is None or not ctx.cfg.reasoning_parser:
        return c
    end, start = ctx.tok.single_token(END), ctx.tok.single_token(START)
    if end is None:
        raise APIError(
            400,
            f"an output format with --reasoning-parser needs {END} to be one token of the tokenizer, and it is not",
            param=param,
        )
    closed = end in ids and (start not in ids or _last(ids, end) > _last(ids, start))
    return c if closed else dataclasses.replace(c, after_token=end)


def _last(ids: list[int], token: int) -> int:
    return len(ids) - 1 - ids[::-1].index(token)


def _reader(ctx: FrontContext, plan: ToolPlan, body: ChatCompletionRequest) -> ChatReader:
    """A reader of one choice's answer."""
    parser = ctx.cfg.reasoning_parser
    reasoning = ReasoningReader(parser) if parser else None
    return ChatReader(reasoning, plan.reader() if plan.reader else None, body.parallel_tool_calls is not False)


def _finish(reason: str, reader: ChatReader) -> str:
    """An answer that ended on its own with tool calls ends with "tool_calls"."""
    return shape.TOOL_CALLS if reader.called and reason == FINISH_STOP else reason


async def _stream(
    ctx: FrontContext,
    body: ChatCompletionRequest,
    request: Request,
    gens: list[Generation],
    rid: str,
    created: int,
    reader: Callable[[], ChatReader],
    prompt_ids: list[int],
) -> EventStream:
    k, route, with_usage = body.top_logprobs or 0, request.url.path, body.include_usage()
    names = body.token_names(ctx.tok)  # the logprobs' tokens' (texts or ids)
    output_tokens = [0] * len(gens)
    stop_echo = StopEcho(ctx.tok, body.stops(), bool(body.skip_special_tokens), len(gens))
    readers = [reader() for _ in gens]
    plain = readers[0].reasoning is None and readers[0].tools is None  # every step's tokens are content

    def usage() -> dict:
        """So far: the prompt counts once for the n generations, its first one's cached tokens with it."""
        return shape.usage(gens[0].pending.prompt_tokens, sum(output_tokens), gens[0].cached_tokens)

    def chunk(choices: list[dict], use: dict | None = None, top: dict | None = None) -> bytes:
        if use is None and body.continuous_usage():
            use = usage()
        out = shape.chat(rid, created, ctx.model_name, choices, use, chunk=True, usage_key=with_usage)
        return sse(out | (top or {}))

    async def events() -> AsyncIterator[bytes]:
        async with contextlib.aclosing(stream):
            for choice, top in _openers(body, len(gens), prompt_ids):
                yield chunk([choice], top=top)
            nxt: tuple | None = first
            while nxt is not None:
                i, item = nxt
                if item.finish_reason == FINISH_ERROR:
                    yield failed_event(ctx.metrics, route, item)
                    break
                output_tokens[i] = max(output_tokens[i], item.output_tokens)
                lp = None
                if body.logprobs and item.token_ids:
                    lp = shape.chat_logprobs(names, item.token_ids, item.logprobs, item.top_logprobs, k)
                text = await stop_echo.text(i, item) if body.include_stop_str_in_output else item.text
                parts = readers[i].feed(text) + (readers[i].finish() if item.finish_reason else [])
                if not parts and item.token_ids and (plain or lp or body.return_token_ids):  # every step with tokens
                    parts = [{"content": ""} if plain else {}]
                for j, part in enumerate(parts):  # the step's logprobs and ids with its first part
                    ids = body.token_ids(item.token_ids if j == 0 else [])
                    yield chunk([shape.chat_delta(i, part, lp if j == 0 else None, "") | ids])
                if item.finish_reason:
                    end = shape.chat_delta(i, {}, None, _finish(item.finish_reason, readers[i]))
                    yield chunk([end | body.token_ids([])])
                nxt = await anext(stream, None)
            else:
                if with_usage:
                    yield chunk([], usage())
            yield sse("[DONE]")

    response = EventStream(events(), on_close=lambda: abandon(ctx, gens), first_ready=True)  # built before the wait
    stream, first = await first_items(ctx, gens, request, coalesce=True)
    return response


def _openers(body: ChatCompletionRequest, n: int, prompt_ids: list[int]) -> list[tuple[dict, dict | None]]:
    """Each choice's first chunk, which names the role (OpenAI's), with the keys the stream's
    first chunk adds at the top: the prompt's ids (vLLM's return_token_ids)."""
    top = {"prompt_token_ids": prompt_ids} if body.return_token_ids else None
    role = {"role": "assistant", "content": ""}
    return [(shape.chat_delta(i, role, None, "") | body.token_ids([]), top if i == 0 else None) for i in range(n)]
