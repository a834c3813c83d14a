"""/generate and /generate_stream through the four services equal Hugging Face's greedy output."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests import hf_reference
from tests.integration.api_helpers import generate, generate_stream
from tools.stack import Stack

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
    long_prompt = "word " * 3000
    cases = [
        (b"{not json", "not valid JSON"),
        (json.dumps({"parameters": {}}).encode(), "inputs: required"),
        (json.dumps({"inputs": "hi", "parameters": {"bogus": 1}}).encode(), "parameters.bogus: unknown parameter"),
        (json.dumps({"inputs": "hi", "parameters": {"max_new_tokens": 0}}).encode(), "parameters.max_new_tokens"),
        (json.dumps({"inputs": "hi", "parameters": {"top_p": 1.5}}).encode(), "parameters.top_p"),
        (json.dumps({"inputs": "hi", "parameters": {"top_p": 0.0}}).encode(), "parameters.top_p"),
        (json.dumps({"inputs": long_prompt}).encode(), "exceed the model's limit of 1024"),
        (json.dumps(["a list"]).encode(), "body"),
        (b"\xff\xfe invalid utf-8", "not valid JSON"),
    ]
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        for path in ("/generate", "/generate_stream"):
            for raw, needle in cases:
                r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
                assert 400 <= r.status_code < 500, (path, raw[:40], r.status_code, r.text)
                assert needle in r.json()["error"], (path, raw[:40], r.text)
        r = client.post("/generate", content=b"x" * (5 * 1024 * 1024), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        # an empty input is a prompt of only the BOS token where the tokenizer adds one, else an error
        empty = client.post("/generate", json={"inputs": ""})
        if hf_reference.tokenizer(stack.model_dir)("")["input_ids"]:
            assert empty.status_code == 200
        else:
            assert empty.status_code == 400 and "the prompt is empty" in empty.json()["error"]
        ok = client.post("/generate", json={"inputs": "still serving?", "parameters": {"max_new_tokens": 3}})
        assert ok.status_code == 200 and ok.json()["count_output_tokens"] >= 1
        assert client.get("/health").status_code == 200
