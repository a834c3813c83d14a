"""The tiny AWQ and GPTQ checkpoints through the whole stack (HTTP to text) on the CPU: 8 concurrent
requests give Hugging Face's greedy output on the dequantized weights."""

from __future__ import annotations

import asyncio

import pytest

from tests import hf_reference
from tests.integration.conftest import start_stack
from tests.integration.test_families_stack import PROMPTS, _generate_all
from tools.redis_server import RedisServer


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_int4_checkpoints_answer_hugging_faces_greedy_text(
    method: str, tiny_int4: dict[str, str], redis_server: RedisServer, tmp_path
) -> None:
    stack = start_stack(tiny_int4[method], redis_server, str(tmp_path))
    try:
        bodies = asyncio.run(_generate_all(stack.url))
    finally:
        stack.stop()
    reference = tiny_int4[method + "-dequantized"]
    tok = hf_reference.tokenizer(reference)
    for i, (prompt, body) in enumerate(zip(PROMPTS, bodies, strict=True)):
        want = hf_reference.greedy(reference, tok(prompt)["input_ids"], 4 + 3 * i, eos=False)
        assert [t["id"] for t in body["tokens"]] == want, (method, prompt)
