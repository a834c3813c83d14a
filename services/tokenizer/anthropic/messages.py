"""POST /v1/messages: Anthropic's Messages API over the chat machinery.

The prompt is rendered as a chat is (prompt.py); one generation runs; its text is read into
thinking, text and tool calls by the chat route's reader, and those become Anthropic's content
blocks (reply.py), whole or streamed (stream.py). A client that goes away aborts the generation,
as on every route."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from services.tokenizer.anthropic.params import MessagesRequest
from services.tokenizer.anthropic.prompt import Prompt, render
from services.tokenizer.anthropic.reply import Blocks, Shell, stop_reason, usage
from services.tokenizer.anthropic.stream import MessageStream
from services.tokenizer.fanout import collect_all, first_items
from services.tokenizer.generation import FrontContext, Generation, Job, abandon, seeds, submit_all
from services.tokenizer.openai.chat import after_thinking
from services.tokenizer.openai.chat_reader import ChatReader
from services.tokenizer.openai.reasoning import ReasoningReader
from services.tokenizer.streaming import EventStream


async def messages(ctx: FrontContext, body: MessagesRequest, request: Request, arrival: float) -> Response:
    prompt = await render(ctx, body)
    constraint = after_thinking(ctx, prompt.plan.constraint, prompt.ids, "tool_choice")
    (seed,) = seeds(None, 1)
    job = Job(prompt.ids, body.sampling(seed, constraint), body.stops(), True, prompt.images)
    gens = await submit_all(ctx, [job], arrival, "max_tokens", "messages")
    shell = Shell(ctx.tok, ctx.model_name, len(prompt.ids), body.stops())
    if body.stream:
        return await _stream(ctx, request, gens, shell, _reader(ctx, prompt, body))
    (out,) = await collect_all(ctx, gens, request)
    reader = _reader(ctx, prompt, body)
    blocks = Blocks()
    blocks.feed(reader.feed(out.text) + reader.finish())
    hit = await shell.stop_hit(out.finish_reason, out.token_ids, out.text)
    reason = stop_reason(out.finish_reason, blocks.called, hit)
    use = usage(len(prompt.ids), out.output_tokens, out.cached_tokens)
    return JSONResponse(shell.message(blocks.content(), reason, hit, use))


def _reader(ctx: FrontContext, prompt: Prompt, body: MessagesRequest) -> ChatReader:
    """The chat route's reader of an answer: thinking (--reasoning-parser), text, tool calls."""
    parser = ctx.cfg.reasoning_parser
    tools = prompt.plan.reader() if prompt.plan.reader else None
    return ChatReader(ReasoningReader(parser) if parser else None, tools, body.parallel_calls() is not False)


async def _stream(
    ctx: FrontContext, request: Request, gens: list[Generation], shell: Shell, reader: ChatReader
) -> EventStream:
    answer = MessageStream(shell, reader, ctx.metrics, request.url.path)

    async def events() -> AsyncIterator[bytes]:
        async with contextlib.aclosing(stream):
            yield answer.start(gens[0].cached_tokens)
            nxt = first
            while nxt is not None:
                chunks, over = await answer.step(nxt[1])
                for chunk in chunks:
                    yield chunk
                if over:
                    return
                nxt = await anext(stream, None)

    response = EventStream(events(), on_close=lambda: abandon(ctx, gens), first_ready=True)  # built before the wait
    stream, first = await first_items(ctx, gens, request, coalesce=True)
    return response
