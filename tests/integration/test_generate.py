"""/generate and /generate_stream through the four services equal Hugging Face's greedy output."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests import hf_reference
from tests.integration.api_helpers import generate, generate_stream
from tests.integration.bad_input import FASTCHAT, LIGHTLLM, cases
from tools import soak_requests
from tools.stack import Stack

MAX_LEN = 1024  # the tiny models' length limit

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "def greet(name: str) -> str:\n    return f'Hello, {name}!'\n\nfor i in range(10):",
    "Once upon a time there was a small town by the sea. " * 4,
    "a b c",
    "Question: Who wrote Hamlet? Answer:",
    "Emoji: 😀 😃 🚀 🌍 and more text after them " * 3,
    "Mathematics is the study of numbers, shapes and patterns. One plus one is",
    "x",
]


def test_concurrent_greedy_equals_hf(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    cases = [(p, 5 + 4 * i) for i, p in enumerate(PROMPTS)]

    async def run() -> tuple[list, list]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
            plain = [generate(client, p, n) for p, n in cases]
            streams = [generate_stream(client, p, n) for p, n in cases]
            results = await asyncio.gather(*plain, *streams)
        return results[: len(cases)], results[len(cases) :]

    plain, streams = asyncio.run(run())
    saw_eos = False
    for (prompt, n), body, events in zip(cases, plain, streams, strict=True):
        ids = tok(prompt)["input_ids"]
        want = hf_reference.greedy(stack.model_dir, ids, n)
        want_text = tok.decode(want, skip_special_tokens=True)
        reason = "stop" if len(want) < n else "length"
        saw_eos |= reason == "stop"
        assert [t["id"] for t in body["tokens"]] == want, prompt
        assert body["generated_text"] == [want_text]
        assert body["finish_reason"] == reason
        assert body["prompt_tokens"] == len(ids)
        assert body["count_output_tokens"] == len(want)
        assert [e["token"]["id"] for e in events] == want, prompt
        assert "".join(e["token"]["text"] for e in events) == want_text
        assert [e["finished"] for e in events] == [False] * (len(want) - 1) + [True]
        assert events[-1]["finish_reason"] == reason
    assert saw_eos, "no prompt ended on EOS: the finish_reason 'stop' path went untested"


def test_stop_sequences_cut_the_text(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    prompt = PROMPTS[4]
    want = hf_reference.greedy(stack.model_dir, tok(prompt)["input_ids"], 30, eos=False)
    text = tok.decode(want, skip_special_tokens=True)
    stop = text[8:11]  # three characters from inside the output
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 30, "ignore_eos": True, "stop_sequences": stop}}
        got = client.post("/generate", json=body).json()
        events = []
        with client.stream("POST", "/generate_stream", json=body) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert got["generated_text"] == [text[: text.index(stop)]]
    assert got["finish_reason"] == "stop"
    assert "".join(e["token"]["text"] for e in events) == text[: text.index(stop)]
    assert events[-1]["finish_reason"] == "stop" and events[-1]["finished"]


def test_bad_input_gets_a_clear_4xx_and_the_service_keeps_serving(stack: Stack) -> None:
    own = [  # LightLLM's own: FastChat's workers ignore unknown keys and read top_p 0 as the smallest nucleus
        (json.dumps({"inputs": "hi", "parameters": {"bogus": 1}}).encode(), "parameters.bogus: unknown parameter"),
        (json.dumps({"inputs": "hi", "parameters": {"top_p": 0.0}}).encode(), "parameters.top_p"),
    ]
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        for path in ("/generate", "/generate_stream"):
            for raw, needle in [*cases(LIGHTLLM, MAX_LEN), *own]:
                r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
                assert 400 <= r.status_code < 500, (path, raw[:40], r.status_code, r.text)
                assert needle in r.json()["error"], (path, raw[:40], r.text)
        r = client.post("/generate", content=b"x" * (5 * 1024 * 1024), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # read before its model: parsed as the models do
        r = client.post("/tokenize", content=deep)
        assert r.status_code == 400 and "recursion limit exceeded" in r.text, r.text
        # an empty input is a prompt of only the BOS token where the tokenizer adds one, else an error
        empty = client.post("/generate", json={"inputs": ""})
        if hf_reference.tokenizer(stack.model_dir)("")["input_ids"]:
            assert empty.status_code == 200
        else:
            assert empty.status_code == 400 and "the prompt is empty" in empty.json()["error"]
        _still_serving(client)


def test_fastchat_routes_refuse_every_bad_input_lightllms_do(stack: Stack) -> None:
    """FastChat's worker protocol answers errors as chunks with HTTP 200 and FastChat's error
    code, which FastChat's API server turns into the HTTP status: 4xxxx codes into a 400. So a
    client error here is a 4xx status from the gates or a chunk with a 4xxxx code."""
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        for path in ("/worker_generate", "/worker_generate_stream"):
            for raw, needle in cases(FASTCHAT, MAX_LEN):
                r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
                assert r.status_code == 200, (path, raw[:40], r.status_code, r.text)
                chunk = json.loads(r.content.split(b"\0")[0])
                assert 40000 <= chunk["error_code"] < 50000, (path, raw[:40], chunk)
                assert needle in chunk["text"], (path, raw[:40], chunk)
            r = client.post(path, content=b"x" * (5 * 1024 * 1024), headers={"Content-Type": "application/json"})
            assert r.status_code == 413
        r = client.post("/count_token", content=cases(FASTCHAT, MAX_LEN)[2][0])  # the deep one
        assert r.status_code == 200 and r.json()["error_code"] == 40001, r.text
        ok = client.post("/worker_generate", json={"prompt": "still serving?", "max_new_tokens": 3})
        assert ok.status_code == 200 and ok.json()["error_code"] == 0 and ok.json()["usage"]["completion_tokens"] >= 1
        _still_serving(client)


def _still_serving(client: httpx.Client) -> None:
    ok = client.post("/generate", json={"inputs": "still serving?", "parameters": {"max_new_tokens": 3}})
    assert ok.status_code == 200 and ok.json()["count_output_tokens"] >= 1
    assert client.get("/health").status_code == 200


def test_every_kind_of_soak_request_is_answered_as_it_must_be(stack: Stack) -> None:
    """tools/soak_requests.py's kinds, all at once and at each of the soak's sizes: each is
    answered as its kind says (a soak counts any other answer as an error)."""

    async def run() -> list[str | None]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            checks = [
                soak_requests.CHECKS[kind](client, model, f"Soak request {i}: the river", n)
                for i, (kind, n) in enumerate((k, n) for k in soak_requests.KINDS for n in (8, 32, 64))
            ]
            return await asyncio.gather(*checks)

    assert asyncio.run(run()) == [None] * 3 * len(soak_requests.KINDS)
