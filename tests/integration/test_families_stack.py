"""Every model family through the whole stack (HTTP to text) on the CPU: 8 concurrent requests
of different lengths, some past the tiny models' sliding windows, give Hugging Face's greedy
output."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests import hf_reference
from tests.conftest import ARCHS, MOE_ARCHS
from tests.integration.conftest import start_stack
from tools.redis_server import RedisServer

PROMPTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。",
    "def greet(name):\n    return 'hello ' + name",
    "Once upon a time there was a small town by the sea. " * 2,
    "a",
    "Question: What is the capital of France? Answer:",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
]


async def _generate_all(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [
            {"inputs": p, "parameters": {"max_new_tokens": 4 + 3 * i, "ignore_eos": True, "return_details": True}}
            for i, p in enumerate(PROMPTS)
        ]
        resps = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
        assert all(r.status_code == 200 for r in resps), [r.text for r in resps]
        return [r.json() for r in resps]


@pytest.mark.parametrize("arch", [*ARCHS, *MOE_ARCHS])
def test_every_family_answers_hugging_faces_greedy_text(
    arch: str, request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path
) -> None:
    model_dir = request.getfixturevalue("tiny_moe_models" if arch in MOE_ARCHS else "tiny_models")[arch]
    stack = start_stack(model_dir, redis_server, str(tmp_path))
    try:
        bodies = asyncio.run(_generate_all(stack.url))
    finally:
        stack.stop()
    tok = hf_reference.tokenizer(model_dir)
    longest = max(len(tok(p)["input_ids"]) for p in PROMPTS)
    assert longest > 8  # past the 8-token sliding window of the tiny Gemma models
    for i, (prompt, body) in enumerate(zip(PROMPTS, bodies, strict=True)):
        want = hf_reference.greedy(model_dir, tok(prompt)["input_ids"], 4 + 3 * i, eos=False)
        assert [t["id"] for t in body["tokens"]] == want, (arch, prompt)
