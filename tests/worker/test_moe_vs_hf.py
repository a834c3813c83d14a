"""The mixture-of-experts families' greedy output on the CPU path equals Hugging Face's, token
for token: whole prompts, prompts in chunks of 16 beside other requests' decodes, and a
tensor-parallel group of two ranks (gloo) sharing each expert."""

from __future__ import annotations

import functools

import pytest
import torch

from services.worker.build import build_engine
from services.worker.tp.group import leave_group, start_group
from shared.config import WorkerConfig
from shared.messages import GenerateReq
from tests import hf_reference
from tests.worker.engine_driver import request, run

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "你好，世界！今天天气很好。",
    "def greet(name):\n    return",
    "Once upon a time there was a small town by the sea. Every morning the fishermen",
    "a",
    "Question: What is the capital of France? Answer:",
]


def _requests(model_dir: str) -> tuple[list[GenerateReq], dict[str, list[int]]]:
    tok = hf_reference.tokenizer(model_dir)
    reqs = [request(str(i), tok(text)["input_ids"], max_new_tokens=6 + 5 * i) for i, text in enumerate(PROMPTS)]
    return reqs, _expected(model_dir)


@functools.cache
def _expected(model_dir: str) -> dict[str, list[int]]:
    """Hugging Face's greedy continuations, once per model for every test here."""
    tok = hf_reference.tokenizer(model_dir)
    return {str(i): hf_reference.greedy(model_dir, tok(t)["input_ids"], 6 + 5 * i) for i, t in enumerate(PROMPTS)}


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("prefill_budget", [8192, 16])
def test_greedy_matches_hf(tiny_moe_models: dict[str, str], arch: str, prefill_budget: int) -> None:
    model_dir = tiny_moe_models[arch]
    engine = build_engine(WorkerConfig(model_dir=model_dir, device="cpu", batch_max_tokens=prefill_budget))
    reqs, expected = _requests(model_dir)
    got = run(engine, reqs)
    for rid, want in expected.items():
        assert got[rid].tokens == want, f"request {rid}"
    assert engine.kv.available_tokens == engine.kv.capacity


def test_tp2_greedy_matches_hf(tiny_moe_models: dict[str, str]) -> None:
    """Qwen2-MoE (routed experts, a shared expert, a QKV bias) over two gloo ranks: rank 0 here,
    rank 1 a child process that runs every step rank 0 sends it."""
    model_dir = tiny_moe_models["qwen2_moe"]
    cfg = WorkerConfig(model_dir=model_dir, device="cpu", tp=2, batch_max_tokens=16)
    reqs, expected = _requests(model_dir)
    threads = torch.get_num_threads()  # joining the group divides the cores between the ranks
    group = start_group(cfg)
    try:
        got = run(build_engine(cfg, group.tp, channel=group.channel), reqs)
    finally:
        group.stop(join_s=20)
        leave_group()
        torch.set_num_threads(threads)
    for rid, want in expected.items():
        assert got[rid].tokens == want, f"request {rid}"
