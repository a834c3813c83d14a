"""The four services with busy polling on (as on a GPU host, where the default turns it on):
outputs equal Hugging Face's greedy ones, one request at a time and many at once, streamed and
whole, and every service says that it polls."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import pathlib
from collections.abc import Iterator

import httpx
import pytest

from tests import hf_reference
from tests.integration.conftest import keyed_stack
from tools.stack import Stack

PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog.", "a b c", "Question: Who wrote Hamlet? Answer:"]


@pytest.fixture(scope="module", params=["llama"])
def polling_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    yield from keyed_stack(request, env={"LS_BUSY_POLL_MS": "200"})


async def _streamed_ids(client: httpx.AsyncClient, prompt: str, max_new: int) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new}}
    ids = []
    async with client.stream("POST", "/generate_stream", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                ids.append(json.loads(line[6:])["token"]["id"])
    return ids


async def _whole_ids(client: httpx.AsyncClient, prompt: str, max_new: int) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "return_details": True}}
    r = await client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return [t["id"] for t in r.json()["tokens"]]


def test_every_service_polls(polling_stack: Stack) -> None:
    paths = glob.glob(os.path.join(polling_stack.opts.log_dir, "*.log"))
    logs = {os.path.basename(p): pathlib.Path(p).read_text(encoding="utf-8") for p in paths}
    assert {"tokenizer.log", "router.log", "worker-0.log", "detokenizer-0.log"} <= set(logs)
    for name, text in logs.items():
        assert "reads poll Redis while requests are in flight and 200 ms after" in text, name


def test_one_at_a_time_and_all_at_once_equal_hf(polling_stack: Stack) -> None:
    tok = hf_reference.tokenizer(polling_stack.model_dir)
    cases = [(p, 4 + 3 * i) for i, p in enumerate(PROMPTS)]
    want = [hf_reference.greedy(polling_stack.model_dir, tok(p)["input_ids"], n) for p, n in cases]

    async def run() -> tuple[list, list]:
        async with httpx.AsyncClient(base_url=polling_stack.url, timeout=60) as client:
            lone = [await _streamed_ids(client, p, n) for p, n in cases * 2]  # each as the last one ends
            together = await asyncio.gather(*[_whole_ids(client, p, n) for p, n in cases * 3])
        return lone, list(together)

    lone, together = asyncio.run(run())
    assert lone == want * 2
    assert together == want * 3
