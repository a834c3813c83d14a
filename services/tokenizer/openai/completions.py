"""POST /v1/completions: prompts (text or token ids) x best_of generations, the best n of
each prompt's returned, whole or streamed."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse

from services.tokenizer.collected import Collected, best
from services.tokenizer.errors import failed_event
from services.tokenizer.fanout import collect_all, first_items
from services.tokenizer.generation import (
    FrontContext,
    Generation,
    Job,
    abandon,
    seeds,
    submit_all,
)
from services.tokenizer.limits import check_token_ids
from services.tokenizer.openai import responses as shape
from services.tokenizer.openai.params import DEFAULT_COMPLETION_TOKENS, CompletionRequest
from services.tokenizer.openai.stop_strings import StopEcho, stop_string_hit
from services.tokenizer.streaming import EventStream, sse
from services.tokenizer.token_names import TokenNames
from shared.messages import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, TextItem

T = TypeVar("T", Collected, TextItem)


async def completions(
    ctx: FrontContext, body: CompletionRequest, request: Request, arrival: float
) -> JSONResponse | EventStream:
    body.check()
    body.check_ids(ctx.vocab_size)
    prompt_ids, prompt_texts = await _prompts(ctx, body)
    # max_tokens 0 (with echo): the prompt alone; one token is generated for its logprobs and dropped
    prompt_only = body.max_tokens == 0
    max_new = 1 if prompt_only else body.max_tokens or DEFAULT_COMPLETION_TOKENS
    body.check_max_tokens(0 if prompt_only else max_new, "max_tokens")
    n, per_prompt = body.n or 1, body.sequences
    k = body.logprobs
    want_lp = k is not None or per_prompt > n  # best_of ranks by cumulative logprob
    # the prompt's logprobs: echo with logprobs, or vLLM's prompt_logprobs (the most alternatives of both)
    prompt_k = max(
        k if body.echo and k is not None else -1, -1 if body.prompt_logprobs is None else body.prompt_logprobs
    )
    all_seeds = iter(seeds(body.seed, len(prompt_ids) * per_prompt))
    jobs = [
        Job(
            ids,
            dataclasses.replace(body.sampling(next(all_seeds), max_new, want_lp, k or 0), prompt_logprobs=prompt_k),
            body.stops(),
            bool(body.skip_special_tokens),
        )
        for ids in prompt_ids
        for _ in range(per_prompt)
    ]
    gens = await submit_all(ctx, jobs, arrival, "max_tokens", "prompt")
    rid, created = gens[0].pending.rid.partition("-")[0], int(time.time())
    echo = prompt_texts if body.echo else [""] * len(prompt_ids)
    if body.stream:
        return await _stream(ctx, body, request, gens, rid, created, echo, prompt_ids, prompt_only)

    outs = await collect_all(ctx, gens, request)
    if prompt_only:
        outs = [no_output(c) for c in outs]
    choices, names = [], body.token_names(ctx.tok)  # names: the logprobs' tokens' (texts or ids)
    for pi in range(len(prompt_ids)):
        for j, c in enumerate(best(outs[pi * per_prompt : (pi + 1) * per_prompt], n)):
            lp = _logprobs(names, body, c, len(echo[pi]), prompt_ids[pi])
            text = c.text
            if body.include_stop_str_in_output and c.finish_reason == FINISH_STOP:
                text += await stop_string_hit(
                    ctx.tok, c.token_ids, c.text, body.stops(), bool(body.skip_special_tokens)
                )
            plp = (
                None
                if body.prompt_logprobs is None
                else shape.vllm_prompt_logprobs(ctx.tok, prompt_ids[pi], c, prompt_k)
            )
            choice = shape.completion_choice(pi * n + j, echo[pi] + text, lp, c.finish_reason, plp)
            choices.append(choice | body.token_ids(c.token_ids, prompt_ids[pi]))
    # a prompt counts once, its first generation's cached tokens with it (docs/api.md)
    cached = sum(c.cached_tokens for c in outs[::per_prompt])
    use = shape.usage(sum(len(ids) for ids in prompt_ids), sum(c.output_tokens for c in outs), cached)
    return JSONResponse(shape.completion(rid, created, ctx.model_name, choices, use))


async def _stream(
    ctx: FrontContext,
    body: CompletionRequest,
    request: Request,
    gens: list[Generation],
    rid: str,
    created: int,
    echo: list[str],
    prompt_ids: list[list[int]],
    prompt_only: bool,
) -> EventStream:
    n, k, route, names = body.n or 1, body.logprobs, request.url.path, body.token_names(ctx.tok)
    builders = [shape.CompletionLogprobs(names, k or 0, len(echo[i // n])) for i in range(len(gens))]
    echoed = [False] * len(gens)
    output_tokens = [0] * len(gens)
    stop_echo = StopEcho(ctx.tok, body.stops(), bool(body.skip_special_tokens), len(gens))
    prompt_tokens = sum(g.pending.prompt_tokens for g in gens[::n])

    def usage() -> dict:
        """So far: a prompt counts once, its first generation's cached tokens with it."""
        return shape.usage(prompt_tokens, sum(output_tokens), sum(g.cached_tokens for g in gens[::n]))

    def chunk(choices: list[dict], use: dict | None = None) -> bytes:
        if use is None and body.continuous_usage():
            use = usage()
        return sse(shape.completion(rid, created, ctx.model_name, choices, use, body.include_usage()))

    async def events() -> AsyncIterator[bytes]:
        async with contextlib.aclosing(stream):
            nxt: tuple | None = first
            while nxt is not None:
                i, item = nxt
                if item.finish_reason == FINISH_ERROR:
                    yield failed_event(ctx.metrics, route, item)
                    break
                item = no_output(item) if prompt_only else item
                output_tokens[i] = max(output_tokens[i], item.output_tokens)
                text = await stop_echo.text(i, item) if body.include_stop_str_in_output else item.text
                lp = builders[i].of(item.token_ids, item.logprobs, item.top_logprobs) if k is not None else None
                plp, ids = None, body.token_ids(item.token_ids)
                if not echoed[i]:  # a generation's first chunk: the echo, the prompt's logprobs and ids
                    echoed[i] = True
                    text = echo[i // n] + text
                    lp, plp = _prompt_logprobs(ctx, names, body, prompt_ids[i // n], item, lp)
                    ids = body.token_ids(item.token_ids, prompt_ids[i // n])
                if has_news(text, item) or plp is not None or "prompt_token_ids" in ids:
                    yield chunk([shape.completion_choice(i, text, lp, item.finish_reason, plp) | ids])
                nxt = await anext(stream, None)
            else:
                if body.include_usage():
                    yield chunk([], usage())
            yield sse("[DONE]")

    # the response is built before the first item is awaited, so that wait is all that stands
    # between the item and its event
    response = EventStream(events(), on_close=lambda: abandon(ctx, gens), first_ready=True)
    stream, first = await first_items(ctx, gens, request, coalesce=True)
    return response


def _logprobs(
    names: TokenNames, body: CompletionRequest, c: Collected, offset: int, prompt_ids: list[int]
) -> dict | None:
    """A whole choice's logprobs (where asked for), from text offset offset; with echo the
    prompt's entries first."""
    k = body.logprobs
    if k is None:
        return None
    lp = shape.CompletionLogprobs(names, k, offset).of(c.token_ids, c.logprobs, c.top_logprobs)
    return shape.with_prompt(names, k, prompt_ids, c, lp) if body.echo else lp


def _prompt_logprobs(
    ctx: FrontContext,
    names: TokenNames,
    body: CompletionRequest,
    prompt_ids: list[int],
    item: TextItem,
    lp: dict | None,
) -> tuple[dict | None, list | None]:
    """A stream's first chunk of a generation: its logprobs lp with the echoed prompt's first
    (echo), and vLLM's prompt_logprobs (where asked for)."""
    if lp is not None and body.echo:
        lp = shape.with_prompt(names, body.logprobs or 0, prompt_ids, item, lp)
    k = body.prompt_logprobs
    return lp, None if k is None else shape.vllm_prompt_logprobs(ctx.tok, prompt_ids, item, k)


async def _prompts(ctx: FrontContext, body: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """Each prompt's token ids (its last truncate_prompt_tokens) and its text (of token ids, or of
    a truncated prompt: decoded, for echo)."""
    prompt_ids, prompt_texts = [], []
    for p in body.prompts():
        if isinstance(p, str):
            ids = await ctx.tok.encode(p)
        else:
            check_token_ids(p, ctx.vocab_size, "prompt")
            ids = p
        kept = body.truncated(ids, ctx.max_total_len)
        prompt_ids.append(kept)
        if isinstance(p, str) and kept is ids:
            prompt_texts.append(p)  # as sent
        else:
            prompt_texts.append(await ctx.tok.decode(kept) if body.echo else "")
    return prompt_ids, prompt_texts


def no_output(c: T) -> T:
    """A generation (Collected) or one of its items with its output taken out: max_tokens 0."""
    reason = c.finish_reason and FINISH_LENGTH
    return dataclasses.replace(
        c, text="", token_ids=[], logprobs=[], top_logprobs=[], output_tokens=0, finish_reason=reason
    )


def has_news(text: str, item: TextItem) -> bool:
    """Whether a stream sends a chunk for this item: for every step that produced tokens, even
    when their bytes do not end a character yet (the text is then empty), as vLLM's streams
    do, so the client sees each step when it comes; and for the end."""
    return bool(text or item.finish_reason or item.token_ids)
