"""The tiny AWQ, GPTQ and FP8 checkpoints (and the unquantized one under --quantization fp8)
through the whole stack (HTTP to text) on the CPU: 8 concurrent requests give Hugging Face's
greedy output on the dequantized weights."""

from __future__ import annotations

import asyncio

import pytest

from tests import hf_reference
from tests.integration.conftest import start_stack
from tests.integration.test_families_stack import PROMPTS, _generate_all
from tests.quant_models import FP8, INT4, quantization_flag
from tools.redis_server import RedisServer


@pytest.mark.parametrize("name", [*INT4, *FP8])
def test_quantized_checkpoints_answer_hugging_faces_greedy_text(
    name: str, tiny_quant: dict[str, str], redis_server: RedisServer, tmp_path
) -> None:
    worker_args = ["--quantization", quantization_flag(name)]
    stack = start_stack(tiny_quant[name], redis_server, str(tmp_path), worker_args=worker_args)
    try:
        bodies = asyncio.run(_generate_all(stack.url))
    finally:
        stack.stop()
    reference = tiny_quant[name + "-dequantized"]
    tok = hf_reference.tokenizer(reference)
    assert len(bodies) == len(PROMPTS) == 8
    for i, (prompt, body) in enumerate(zip(PROMPTS, bodies, strict=True)):
        want = hf_reference.greedy(reference, tok(prompt)["input_ids"], 4 + 3 * i, eos=False)
        assert [t["id"] for t in body["tokens"]] == want, (name, prompt)
