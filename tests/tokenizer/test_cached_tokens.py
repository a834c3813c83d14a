"""The prompt tokens the worker's prompt cache held, from the text items to the answers, in
process: the real app and routes over a stand-in for the pipeline that answers each
generation with scripted text items. OpenAI's usage.prompt_tokens_details.cached_tokens is
read back through the openai client (a prompt counts once, with its first generation's
count), LightLLM's prompt_cache_len from the JSON, and the front end's counter from
/metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types import CompletionUsage
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import ASGIApp

from services.tokenizer.app import create_app
from services.tokenizer.generation import FrontContext
from services.tokenizer.images.front import ImageFront, PromptImages
from services.tokenizer.metrics import FrontMetrics
from services.tokenizer.pipeline import Liveness, PendingRequest
from services.tokenizer.tokenization import Tokenization
from shared.config import TokenizerConfig
from shared.messages import FINISH_LENGTH, SamplingParams, TextItem

MODEL = "tiny"
TOKEN = 5  # the token every scripted item carries


class ScriptedPipeline:
    """What the routes ask of services/tokenizer/pipeline.py. Generation i of a request gets
    two text items at once, both carrying cached[i] (the detokenizer puts the worker's count on
    every item); the later a generation, the higher its logprobs (best_of picks the last)."""

    def __init__(self, cached: list[int]) -> None:
        self.cached = cached
        self.live = Liveness()
        self.pending: dict[str, PendingRequest] = {}

    async def submit(
        self,
        rid: str,
        input_ids: list[int],
        params: SamplingParams,
        stop: list[str],
        skip_special_tokens: bool,
        deadline: float,
        queue: asyncio.Queue[tuple[int, TextItem]],
        index: int,
        images: PromptImages | None = None,
    ) -> PendingRequest:
        lp = [float(index - len(self.cached))]
        known = {"logprobs": lp, "prompt_tokens": len(input_ids), "cached_tokens": self.cached[index]}
        queue.put_nowait((index, TextItem(rid, "a", [TOKEN], output_tokens=1, **known)))
        last = TextItem(rid, "b", [TOKEN], finish_reason=FINISH_LENGTH, output_tokens=2, **known)
        queue.put_nowait((index, last))
        return PendingRequest(rid, "detok-0", len(input_ids), queue, index)

    def abort(self, rid: str, reason: str) -> None:
        pass

    def done(self, rid: str) -> None:
        pass


@pytest.fixture(scope="module")
def tok(tiny_llama: str) -> Iterator[Tokenization]:
    t = Tokenization(tiny_llama, threads=1)
    yield t
    t.shutdown()


def front(tok: Tokenization, cached: list[int]) -> tuple[ASGIApp, FrontContext]:
    cfg = TokenizerConfig(model_dir="unused", model_name=MODEL)
    pipeline: Any = ScriptedPipeline(cached)
    ctx = FrontContext(
        cfg, pipeline, tok, 512, MODEL, len(tok.hf), FrontMetrics(), time.time(), ImageFront(cfg, None, "")
    )
    return create_app(ctx), ctx


def client(app: ASGIApp) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front")
    return openai.AsyncOpenAI(base_url="http://front/v1", api_key="none", max_retries=0, http_client=http)


async def post(app: ASGIApp, path: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as http:
        return await http.post(path, json=body)


def cached_counter(ctx: FrontContext) -> float | None:
    return ctx.metrics.registry.get_sample_value("lightstream_front_cached_prompt_tokens_total")


# long enough for every scripted count to be a part of the prompt
PROMPTS = ["Once upon a time there was a small town by the sea.", "The quick brown fox jumps over the lazy dog."]
CHAT = [{"role": "user", "content": PROMPTS[0]}]


def test_chat_usage_has_the_cached_tokens_the_client_reads(tok: Tokenization) -> None:
    app, ctx = front(tok, [6, 9])

    async def run() -> openai.types.chat.ChatCompletion:
        return await client(app).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, n=2)

    got = asyncio.run(run())
    assert got.usage is not None and got.usage.prompt_tokens_details is not None
    assert got.usage.prompt_tokens_details.cached_tokens == 6  # the prompt once, its first generation's
    assert got.usage.completion_tokens == 4
    assert cached_counter(ctx) == 15  # every generation counts: beside the prompt tokens counter, per generation
    assert ctx.metrics.registry.get_sample_value("lightstream_front_prompt_tokens_total") == 2 * got.usage.prompt_tokens


def test_chat_stream_carries_them_in_the_usage_chunks(tok: Tokenization) -> None:
    app, _ = front(tok, [3])

    async def run() -> list[Any]:
        stream = await client(app).chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
        return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == 3
    # continuous usage: a stream's first byte waits for its first item, so every chunk knows it
    assert [c.usage.prompt_tokens_details.cached_tokens for c in chunks] == [3] * len(chunks)


def test_completions_sum_the_prompts_first_generations(tok: Tokenization) -> None:
    app, ctx = front(tok, [4, 8, 2, 2])  # prompt 0: generations 0, 1; prompt 1: generations 2, 3

    async def run() -> tuple[Any, list[Any]]:
        c = client(app)
        whole = await c.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=2, n=2)
        stream = await c.completions.create(
            model=MODEL,
            prompt=PROMPTS,
            max_tokens=2,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        return whole, [chunk async for chunk in stream]

    whole, chunks = asyncio.run(run())
    assert whole.usage.prompt_tokens_details.cached_tokens == 4 + 2
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 4 + 2
    assert all(c.usage is None for c in chunks[:-1])
    assert cached_counter(ctx) == 2 * (4 + 8 + 2 + 2)


def test_best_of_counts_the_first_generation_not_the_one_returned(tok: Tokenization) -> None:
    """Usage is the request's (completion_tokens counts every generation of best_of), so the
    prompt's cached tokens are its first generation's there too."""
    app, _ = front(tok, [1, 7, 7])
    body = {"model": MODEL, "prompt": PROMPTS[1], "max_tokens": 2, "best_of": 3, "logprobs": 0}
    got = asyncio.run(post(app, "/v1/completions", body)).json()
    assert got["choices"][0]["logprobs"]["token_logprobs"] == [-1.0, -1.0]  # the last generation won
    assert got["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    assert got["usage"]["completion_tokens"] == 6


def test_nothing_cached_is_a_zero_not_an_absent_field(tok: Tokenization) -> None:
    app, ctx = front(tok, [0])
    r = asyncio.run(post(app, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 2}))
    use = r.json()["usage"]
    assert use["prompt_tokens_details"] == {"cached_tokens": 0}  # as OpenAI answers
    assert CompletionUsage.model_validate(use).prompt_tokens_details.cached_tokens == 0  # the SDK's model, validating
    assert cached_counter(ctx) == 0


def test_lightllm_generate_has_prompt_cache_len_beside_prompt_tokens(tok: Tokenization) -> None:
    app, _ = front(tok, [5, 2])
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 2, "n": 2, "do_sample": True}}
    got = asyncio.run(post(app, "/generate", body)).json()
    assert got["prompt_cache_len"] == 5 and got["prompt_tokens"] == len(tok.hf(PROMPTS[0])["input_ids"])
    assert got["count_output_tokens"] == [2, 2]


def test_lightllm_stream_has_it_in_the_last_events_details(tok: Tokenization) -> None:
    app, _ = front(tok, [5])
    body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 2, "return_details": True}}
    r = asyncio.run(post(app, "/generate_stream", body))
    events = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    assert [e["details"] for e in events[:-1]] == [None]
    details = events[-1]["details"]
    assert details["prompt_cache_len"] == 5 and details["generated_tokens"] == 2


def test_the_counter_is_served_from_the_start(tok: Tokenization) -> None:
    app, _ = front(tok, [0])

    async def scrape() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://front") as http:
            return (await http.get("/metrics")).text

    families = {f.name for f in text_string_to_metric_families(asyncio.run(scrape()))}
    assert {"lightstream_front_cached_prompt_tokens", "lightstream_front_prompt_tokens"} <= families
