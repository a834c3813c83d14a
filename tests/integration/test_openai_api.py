"""The OpenAI routes driven by the real `openai` package against the whole stack, which
here asks for API keys: greedy output equal to Hugging Face's, streaming, n, seeds,
best_of, stop strings, penalties, logprobs, usage, errors in OpenAI's shape, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch

from tests import hf_reference
from tests.integration.api_helpers import delta, hf_logprobs, hf_penalised_greedy, metric_samples
from tests.integration.conftest import keyed_stack
from tools.stack import Stack

KEY = "sk-test-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。",
    "Once upon a time there was a small town by the sea. " * 3,
    "Emoji: 😀 🚀 and more",
    "x",
]
CHATS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is two plus two?"}],
    [
        {"role": "user", "content": "Tell me about the sea."},
        {"role": "assistant", "content": "The sea is wide."},
        {"role": "user", "content": [{"type": "text", "text": "More, "}, {"type": "text", "text": "please."}]},
    ],
]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    yield from keyed_stack(request, tokenizer_args=["--api-key", "other", "--api-key", KEY])


def _client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _sync_client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _flat_chat(messages: list[dict]) -> list[dict]:
    """Content parts joined, as the server hands them to the template."""
    out = []
    for m in messages:
        c = m["content"]
        out.append({**m, "content": c if isinstance(c, str) else "".join(p["text"] for p in c)})
    return out


def _chat_ids(model_dir: str, messages: list[dict]) -> list[int]:
    tok = hf_reference.tokenizer(model_dir)
    text = tok.apply_chat_template(_flat_chat(messages), tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def test_models_lists_the_served_model(stack: Stack) -> None:
    models = _sync_client(stack).models.list()
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
        async with _client(stack) as client:
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
        async with _client(stack) as client:
            return await asyncio.gather(*(_chat_both_ways(client, stack.model_name, m, n) for m, n in cases))

    for (messages, n), (whole, chunks) in zip(cases, asyncio.run(run()), strict=True):
        ids = _chat_ids(stack.model_dir, messages)
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
    ids = _chat_ids(stack.model_dir, CHATS[0])
    r = _sync_client(stack).chat.completions.create(
        model=stack.model_name, messages=CHATS[0], temperature=0, extra_body={"stop": ["\n", "e"]}
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens >= 1


def test_logprobs_equal_hf(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    client = _sync_client(stack)
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
    ids = _chat_ids(stack.model_dir, messages)
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


def test_n_and_seed_are_reproducible_and_streaming_matches(stack: Stack) -> None:
    kw = {"model": stack.model_name, "prompt": PROMPTS[1], "max_tokens": 10, "temperature": 1.0, "seed": 1234}

    async def run() -> tuple:
        async with _client(stack) as client:
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
        async with _client(stack) as client:
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
        async with _client(stack) as client:
            best = client.completions.create(best_of=4, n=2, seed=500, **kw)
            singles = [client.completions.create(seed=500 + i, **kw) for i in range(4)]
            return await asyncio.gather(best, *singles)

    best, *singles = asyncio.run(run())
    ranked = sorted(singles, key=lambda r: -sum(r.choices[0].logprobs.token_logprobs))
    assert [c.text for c in best.choices] == [r.choices[0].text for r in ranked[:2]]
    assert best.usage.completion_tokens == sum(r.usage.completion_tokens for r in singles)


def test_stop_strings_and_penalties(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    client = _sync_client(stack)
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


# (parameter, bad value, the param named in the error[, other fields of the body])
COMMON_BAD = [
    ("temperature", -0.1, "temperature"),
    ("temperature", 2.5, "temperature"),
    ("top_p", 0.0, "top_p"),
    ("top_p", 1.5, "top_p"),
    ("n", 0, "n"),
    ("n", 17, "n"),
    ("presence_penalty", -2.5, "presence_penalty"),
    ("presence_penalty", 2.5, "presence_penalty"),
    ("frequency_penalty", -3, "frequency_penalty"),
    ("frequency_penalty", 2.01, "frequency_penalty"),
    ("seed", 2**64, "seed"),
    ("seed", "7", "seed"),
    ("stop", [""], "stop"),
    ("stop", ["a"] * 17, "stop"),
    ("stop", 5, "stop"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", 5000, "max_tokens"),
    ("stream", "yes", "stream"),
    ("stream_options", {"include_usage": True}, "stream_options"),  # without stream
    ("user", 5, "user"),
    ("logit_bias", {"5": 1.0}, "logit_bias"),
    ("top_k", 0, "top_k"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("min_tokens", -1, "min_tokens"),
    ("min_tokens", 100, "min_tokens", {"max_tokens": 5}),
    ("ignore_eos", "yes", "ignore_eos"),
    ("stop_token_ids", [-1], "stop_token_ids.0"),
    ("stop_token_ids", [10**6], "stop_token_ids"),
    ("skip_special_tokens", 1, "skip_special_tokens"),
    ("no_such_parameter", 1, "no_such_parameter"),
]
COMPLETIONS_BAD = [
    ("prompt", [], "prompt"),
    ("prompt", [10**6], "prompt"),
    ("prompt", 3, "prompt"),
    ("best_of", 0, "best_of"),
    ("best_of", 17, "best_of"),
    ("best_of", 1, "best_of", {"n": 2}),
    ("best_of", 3, "best_of", {"stream": True}),
    ("logprobs", -1, "logprobs"),
    ("logprobs", 21, "logprobs"),
    ("echo", "x", "echo"),
    ("suffix", "the end", "suffix"),
]
CHAT_BAD = [
    ("messages", [], "messages"),
    ("messages", [{"role": "wizard", "content": "hi"}], "messages.0.role"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages.0.content"),
    ("messages", [{"role": "user", "content": "hi", "extra": 1}], "messages.0.extra"),
    ("max_completion_tokens", 0, "max_completion_tokens"),
    ("logprobs", "yes", "logprobs"),
    ("top_logprobs", 21, "top_logprobs"),
    ("top_logprobs", -1, "top_logprobs"),
    ("top_logprobs", 2, "top_logprobs"),  # without logprobs
    ("tools", [{"type": "function", "function": {"name": "f"}}], "tools"),
    ("response_format", {"type": "json_object"}, "response_format"),
]


def _bad_request(client: openai.OpenAI, route: str, base: dict, case: tuple) -> openai.APIStatusError:
    param, value, _, *extra = case
    body = {**base, **(extra[0] if extra else {}), param: value}
    create = client.completions.create if route == "completions" else client.chat.completions.create
    named = {k: body.pop(k) for k in ("model", "prompt", "messages") if k in body}
    with pytest.raises(openai.APIStatusError) as e:
        create(**named, extra_body=body)
    return e.value


def test_each_bad_parameter_gets_a_4xx_naming_it(stack: Stack) -> None:
    client = _sync_client(stack)
    cases = [("completions", {"model": stack.model_name, "prompt": "hi"}, c) for c in COMMON_BAD + COMPLETIONS_BAD]
    cases += [("chat", {"model": stack.model_name, "messages": CHATS[0]}, c) for c in COMMON_BAD + CHAT_BAD]
    for route, base, case in cases:
        err = _bad_request(client, route, base, case)
        where, named = (route, *case), case[2]
        assert err.status_code == 400, (where, err.status_code, err.body)
        assert set(err.body) == {"message", "type", "param", "code"}, (where, err.body)
        assert err.body["type"] == "invalid_request_error"
        assert err.body["param"] == named, (where, err.body)
        assert named.split(".")[0] in err.body["message"], (where, err.body)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="hi")
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    r = httpx.post(
        stack.url + "/v1/completions", content=b"{oops", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    # the service keeps serving
    ok = client.completions.create(model=stack.model_name, prompt="still there?", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens >= 1


def test_api_keys(stack: Stack) -> None:
    bad = openai.OpenAI(base_url=stack.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=stack.model_name, prompt="hi", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
        r = http.post("/generate", json={"inputs": "hi"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error_type"] == "invalid_api_key"
        assert http.get("/metrics").status_code == 401
        assert http.get("/health").status_code == 200  # load balancers probe it without a key
        other = http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}, headers=AUTH)
        assert other.status_code == 200
        r = http.post(
            "/generate",
            json={"inputs": "hi", "parameters": {"max_new_tokens": 2}},
            headers={"Authorization": "Bearer other"},
        )
        assert r.status_code == 200  # every configured key works


def test_metrics_count_requests_tokens_and_latencies(stack: Stack) -> None:
    client = _sync_client(stack)
    before = metric_samples(stack.url, AUTH)
    r = client.completions.create(model=stack.model_name, prompt=PROMPTS[1], max_tokens=7, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=stack.model_name, prompt="hi", temperature=9)
    after = metric_samples(stack.url, AUTH)
    route = "/v1/completions"
    assert delta(before, after, "lightstream_front_requests_total", route=route) == 2
    assert delta(before, after, "lightstream_front_request_errors_total", route=route, code="400") == 1
    assert delta(before, after, "lightstream_front_prompt_tokens_total") == r.usage.prompt_tokens
    assert delta(before, after, "lightstream_front_generation_tokens_total") == r.usage.completion_tokens
    reason = "length" if r.choices[0].finish_reason == "length" else "stop"
    assert delta(before, after, "lightstream_front_generations_total", finish_reason=reason) == 1
    for name in ("queue_time_seconds", "time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta(before, after, f"lightstream_front_{name}_count") == 1, name
        assert delta(before, after, f"lightstream_front_{name}_sum") > 0, name
    if r.usage.completion_tokens > 1:
        assert delta(before, after, "lightstream_front_time_per_output_token_seconds_count") == 1
    assert after[("lightstream_front_generations_in_flight", ())] == 0
