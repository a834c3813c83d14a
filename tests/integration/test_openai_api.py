"""The OpenAI routes driven by the real `openai` package against the whole stack, which
here asks for API keys: greedy output equal to Hugging Face's, streaming, n, seeds,
best_of, stop strings, penalties, logprobs (vLLM's return_tokens_as_token_ids too), vLLM's
return_token_ids, usage. Errors, keys and metrics: test_openai_api_errors.py."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch

from tests import hf_reference
from tests.integration.api_helpers import hf_logprobs, hf_penalised_greedy
from tests.integration.openai_helpers import (  # noqa: F401 (_stack: a fixture)
    AUTH,
    CHATS,
    PROMPTS,
    _stack,
    async_client,
    chat_ids,
    sync_client,
)
from tools.stack import Stack


def test_models_lists_the_served_model(stack: Stack) -> None:
    models = sync_client(stack).models.list()
    assert [m.id for m in models.data] == [stack.model_name]


async def _completion_both_ways(client: openai.AsyncOpenAI, model: str, prompt, max_tokens: int) -> tuple:
    whole = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    chunks = [
        c
        async for c in await client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    return whole, chunks


def test_completions_greedy_equal_hf(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    cases = [(p, 4 + 5 * i) for i, p in enumerate(PROMPTS)]
    ids_case = (tok(PROMPTS[1])["input_ids"], 9)  # a prompt given as token ids

    async def run() -> list:
        async with async_client(stack) as client:
            calls = [_completion_both_ways(client, stack.model_name, p, n) for p, n in [*cases, ids_case]]
            return await asyncio.gather(*calls)

    results = asyncio.run(run())
    for (prompt, n), (whole, chunks) in zip([*cases, ids_case], results, strict=True):
        ids = prompt if isinstance(prompt, list) else tok(prompt)["input_ids"]
        want = hf_reference.greedy(stack.model_dir, ids, n)
        text = tok.decode(want, skip_special_tokens=True)
        reason = "stop" if len(want) < n else "length"
        assert whole.object == "text_completion" and len(whole.choices) == 1
        assert whole.choices[0].text == text, prompt
        assert whole.choices[0].finish_reason == reason
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), len(want))
        assert whole.usage.total_tokens == len(ids) + len(want)
        *body, last = chunks
        assert "".join(c.choices[0].text for c in body) == text
        assert [c.choices[0].finish_reason for c in body][-1] == reason
        assert all(c.choices[0].finish_reason is None for c in body[:-1])
        assert last.choices == [] and last.usage.completion_tokens == len(want)
        assert last.usage.prompt_tokens == len(ids)


async def _chat_both_ways(client: openai.AsyncOpenAI, model: str, messages: list, max_tokens: int) -> tuple:
    whole = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,
        max_completion_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    return whole, [c async for c in stream]


def test_chat_greedy_equals_hf_on_the_rendered_template(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    cases = [(m, 6 + 7 * i) for i, m in enumerate(CHATS)]

    async def run() -> list:
        async with async_client(stack) as client:
            return await asyncio.gather(*(_chat_both_ways(client, stack.model_name, m, n) for m, n in cases))

    for (messages, n), (whole, chunks) in zip(cases, asyncio.run(run()), strict=True):
        ids = chat_ids(stack.model_dir, messages)
        want = hf_reference.greedy(stack.model_dir, ids, n)
        text = tok.decode(want, skip_special_tokens=True)
        reason = "stop" if len(want) < n else "length"
        choice = whole.choices[0]
        assert whole.object == "chat.completion"
        assert choice.message.role == "assistant" and choice.message.content == text
        assert choice.finish_reason == reason
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), len(want))
        *body, last = chunks
        assert body[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in body) == text
        assert body[-1].choices[0].finish_reason == reason
        assert all(c.object == "chat.completion.chunk" and c.usage is None for c in body)
        assert last.choices == [] and last.usage.completion_tokens == len(want)


def test_chat_without_max_tokens_runs_to_an_end(stack: Stack) -> None:
    """No max_tokens: the output may use the rest of the context, as with OpenAI."""
    ids = chat_ids(stack.model_dir, CHATS[0])
    r = sync_client(stack).chat.completions.create(
        model=stack.model_name, messages=CHATS[0], temperature=0, extra_body={"stop": ["\n", "e"]}
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens >= 1


def test_logprobs_equal_hf(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    client = sync_client(stack)
    prompt = PROMPTS[3]
    r = client.completions.create(model=stack.model_name, prompt=prompt, max_tokens=8, temperature=0, logprobs=3)
    ids = tok(prompt)["input_ids"]
    want = hf_reference.greedy(stack.model_dir, ids, 8)
    lp = hf_logprobs(stack.model_dir, ids, want)
    got = r.choices[0].logprobs
    for label, t in zip(got.tokens, want, strict=True):  # a part of a character is named by its bytes
        text = tok.decode([t])
        assert label == text if "\ufffd" not in text else label.startswith("bytes:\\x"), (label, text)
    assert got.token_logprobs == pytest.approx([float(lp[i, t]) for i, t in enumerate(want)], abs=1e-3)
    for i, top in enumerate(got.top_logprobs):
        best = torch.topk(lp[i], 3).values.tolist()
        assert sorted(top.values(), reverse=True)[0] == pytest.approx(best[0], abs=1e-3)
        assert len(top) <= 4  # the top 3 and the sampled token
    assert got.text_offset[0] == 0 and got.text_offset == sorted(got.text_offset)

    messages = CHATS[1]
    r = client.chat.completions.create(
        model=stack.model_name, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    ids = chat_ids(stack.model_dir, messages)
    want = hf_reference.greedy(stack.model_dir, ids, 6)
    lp = hf_logprobs(stack.model_dir, ids, want)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([float(lp[i, t]) for i, t in enumerate(want)], abs=1e-3)
    for i, c in enumerate(content):
        assert len(c.top_logprobs) == 2
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(torch.topk(lp[i], 2).values.tolist(), abs=1e-3)
    # the bytes of the tokens, parts of characters included, make up the text
    specials = set(tok.all_special_ids)
    pieces = [bytes(c.bytes) for c, t in zip(content, want, strict=True) if t not in specials]
    text = b"".join(pieces).decode("utf-8", errors="replace")
    assert text == r.choices[0].message.content


IDS = {"return_token_ids": True, "return_tokens_as_token_ids": True}  # vLLM's


def _post(stack: Stack, route: str, body: dict) -> dict:
    r = httpx.post(stack.url + route, json={"model": stack.model_name, **body}, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _text_of(stack: Stack, ids: list[int]) -> str:
    """/detokenize's text of ids, special tokens (the output skips them) left out."""
    specials = set(hf_reference.tokenizer(stack.model_dir).all_special_ids)
    return _post(stack, "/detokenize", {"tokens": [t for t in ids if t not in specials]})["prompt"]


def test_completions_return_token_ids_and_name_tokens_by_id(stack: Stack) -> None:
    client = sync_client(stack)
    kw = {"model": stack.model_name, "prompt": PROMPTS[4], "max_tokens": 8, "temperature": 0, "logprobs": 2}
    plain, whole = client.completions.create(**kw).choices[0], client.completions.create(**kw, extra_body=IDS)
    got = whole.choices[0]
    prompt_ids, ids = got.model_extra["prompt_token_ids"], got.model_extra["token_ids"]
    assert prompt_ids == _post(stack, "/tokenize", {"prompt": PROMPTS[4]})["tokens"]
    assert not {"prompt_token_ids", "token_ids"} & set(plain.model_extra) and got.text == plain.text
    assert _text_of(stack, ids) == got.text and len(ids) == whole.usage.completion_tokens
    assert got.logprobs.tokens == [f"token_id:{t}" for t in ids]
    assert got.logprobs.text_offset == plain.logprobs.text_offset
    assert got.logprobs.token_logprobs == plain.logprobs.token_logprobs
    for top, label in zip(got.logprobs.top_logprobs, got.logprobs.tokens, strict=True):
        assert label in top and all(key.startswith("token_id:") for key in top)
    chunks = [c.choices[0] for c in client.completions.create(**kw, stream=True, extra_body=IDS) if c.choices]
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    assert not any("prompt_token_ids" in c.model_extra for c in chunks[1:])
    assert [t for c in chunks for t in c.model_extra["token_ids"]] == ids
    assert [t for c in chunks for t in c.logprobs.tokens] == got.logprobs.tokens
    echo = client.completions.create(**{**kw, "max_tokens": 1}, echo=True, extra_body=IDS).choices[0]
    both = echo.model_extra["prompt_token_ids"] + echo.model_extra["token_ids"]
    assert echo.logprobs.tokens == [f"token_id:{t}" for t in both]


def test_chat_returns_token_ids_and_names_tokens_by_id(stack: Stack) -> None:
    client = sync_client(stack)
    kw = {"model": stack.model_name, "messages": CHATS[1], "max_tokens": 6, "temperature": 0}
    kw |= {"logprobs": True, "top_logprobs": 2}
    plain, whole = client.chat.completions.create(**kw), client.chat.completions.create(**kw, extra_body=IDS)
    prompt_ids, ids = whole.model_extra["prompt_token_ids"], whole.choices[0].model_extra["token_ids"]
    assert (
        prompt_ids == _post(stack, "/tokenize", {"messages": CHATS[1]})["tokens"] == chat_ids(stack.model_dir, CHATS[1])
    )
    assert "prompt_token_ids" not in plain.model_extra and "token_ids" not in plain.choices[0].model_extra
    content = whole.choices[0].logprobs.content
    assert _text_of(stack, ids) == whole.choices[0].message.content == plain.choices[0].message.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in ids]
    assert all(t.token.startswith("token_id:") for c in content for t in c.top_logprobs)
    assert [c.bytes for c in content] == [c.bytes for c in plain.choices[0].logprobs.content]  # the real bytes
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body=IDS))
    assert chunks[0].model_extra["prompt_token_ids"] == prompt_ids
    assert not any("prompt_token_ids" in c.model_extra for c in chunks[1:])
    assert [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]] == ids
    labels = [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert labels == [c.token for c in content]


def test_n_and_seed_are_reproducible_and_streaming_matches(stack: Stack) -> None:
    kw = {"model": stack.model_name, "prompt": PROMPTS[1], "max_tokens": 10, "temperature": 1.0, "seed": 1234}

    async def run() -> tuple:
        async with async_client(stack) as client:
            a, b = await asyncio.gather(client.completions.create(n=3, **kw), client.completions.create(n=3, **kw))
            stream = await client.completions.create(n=3, stream=True, **kw)
            chunks = [c async for c in stream]
            single = await client.completions.create(**{**kw, "seed": 1235})  # the second of n=3
            chat = await client.chat.completions.create(
                model=stack.model_name, messages=CHATS[0], max_tokens=8, n=2, seed=99, temperature=0.8
            )
            chat_stream = await client.chat.completions.create(
                model=stack.model_name, messages=CHATS[0], max_tokens=8, n=2, seed=99, temperature=0.8, stream=True
            )
            return a, b, chunks, single, chat, [c async for c in chat_stream]

    a, b, chunks, single, chat, chat_chunks = asyncio.run(run())
    texts = [c.text for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert texts == [c.text for c in b.choices]
    assert len(set(texts)) > 1, "three seeds gave one text: sampling is not seeded per sequence"
    assert single.choices[0].text == texts[1]
    assert a.usage.completion_tokens == b.usage.completion_tokens
    streamed = ["", "", ""]
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] += ch.text
    assert streamed == texts
    chat_streamed = ["", ""]
    for c in chat_chunks:
        for ch in c.choices:
            chat_streamed[ch.index] += ch.delta.content or ""
    assert chat_streamed == [c.message.content for c in chat.choices]


def test_a_stream_carries_every_token_and_no_empty_chunk(stack: Stack) -> None:
    """Every generated token reaches the client in a chunk (tokens whose bytes do not end a
    character yet included: their chunk's text is empty), and no chunk without a token is
    sent. A stream that keeps up gets a chunk per step; one that falls behind (a loaded
    machine) gets the queued steps joined, so the check counts tokens, not chunks."""

    async def run() -> list:
        async with async_client(stack) as client:
            stream = await client.completions.create(
                model=stack.model_name,
                prompt=PROMPTS[4],
                max_tokens=24,
                logprobs=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            return [c async for c in stream]

    chunks = asyncio.run(run())
    with_choice = [c for c in chunks if c.choices]
    assert chunks[-1].usage.completion_tokens == 24
    per_chunk = [len(c.choices[0].logprobs.tokens) for c in with_choice]
    assert sum(per_chunk) == 24 and min(per_chunk) >= 1, per_chunk
    assert with_choice[-1].choices[0].finish_reason == "length"


def test_best_of_returns_the_highest_cumulative_logprob(stack: Stack) -> None:
    kw = {"model": stack.model_name, "prompt": PROMPTS[4], "max_tokens": 8, "temperature": 1.0, "logprobs": 0}

    async def run() -> tuple:
        async with async_client(stack) as client:
            best = client.completions.create(best_of=4, n=2, seed=500, **kw)
            singles = [client.completions.create(seed=500 + i, **kw) for i in range(4)]
            return await asyncio.gather(best, *singles)

    best, *singles = asyncio.run(run())
    ranked = sorted(singles, key=lambda r: -sum(r.choices[0].logprobs.token_logprobs))
    assert [c.text for c in best.choices] == [r.choices[0].text for r in ranked[:2]]
    assert best.usage.completion_tokens == sum(r.usage.completion_tokens for r in singles)


def test_stop_strings_and_penalties(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    client = sync_client(stack)
    prompt = PROMPTS[3]
    ids = tok(prompt)["input_ids"]
    want = hf_reference.greedy(stack.model_dir, ids, 30, eos=False)
    text = tok.decode(want, skip_special_tokens=True)
    stop = text[6:9]
    for stops in (stop, ["\x00never", stop]):
        r = client.completions.create(
            model=stack.model_name,
            prompt=prompt,
            max_tokens=30,
            temperature=0,
            stop=stops,
            extra_body={"ignore_eos": True},
        )
        assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=stack.model_name,
            prompt=prompt,
            max_tokens=30,
            temperature=0,
            stop=stop,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert streamed == text[: text.index(stop)]

    penalised = hf_penalised_greedy(stack.model_dir, ids, 12, presence=0.7, frequency=1.3)
    r = client.completions.create(
        model=stack.model_name,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        presence_penalty=0.7,
        frequency_penalty=1.3,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == tok.decode(penalised, skip_special_tokens=True)
