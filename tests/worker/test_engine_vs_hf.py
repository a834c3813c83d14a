"""The CPU path's greedy output equals Hugging Face's, token for token."""

from __future__ import annotations

import pytest

from services.worker.build import build_engine
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run

PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. " * 6,
    "你好，世界！今天天气很好。",
    "def greet(name):\n    return",
    "Once upon a time there was a small town by the sea. Every morning the fishermen",
    "a",
    "Emoji: 😀 🚀 and symbols ∑ ∫ √",
    "Question: What is the capital of France? Answer:",
]


def _requests(model_dir: str, eos: bool = True):
    tok = hf_reference.tokenizer(model_dir)
    reqs, expected = [], {}
    for i, text in enumerate(PROMPTS):
        ids = tok(text)["input_ids"]
        n = 6 + 5 * i
        reqs.append(request(str(i), ids, max_new_tokens=n, ignore_eos=not eos))
        expected[str(i)] = hf_reference.greedy(model_dir, ids, n, eos=eos)
    return reqs, expected


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3"])
@pytest.mark.parametrize("prefill_budget", [8192, 16])
def test_greedy_matches_hf(tiny_models: dict[str, str], arch: str, prefill_budget: int) -> None:
    model_dir = tiny_models[arch]
    engine = build_engine(WorkerConfig(model_dir=model_dir, batch_max_tokens=prefill_budget))
    reqs, expected = _requests(model_dir)
    got = run(engine, reqs)
    for rid, want in expected.items():
        assert got[rid].tokens == want, f"request {rid}"
        assert got[rid].finish_reason == ("stop" if len(want) < reqs[int(rid)].params.max_new_tokens else "length")
    assert engine.kv.available_tokens == engine.kv.capacity  # every slot came back


@pytest.mark.parametrize("pool, cache", [(160, False), (120, True)])
def test_preempted_requests_finish_with_the_same_output(tiny_llama: str, pool: int, cache: bool) -> None:
    """A pool far too small for the batch forces pauses and re-prefills (with the prompt cache,
    evictions on most steps first); outputs must not change."""
    reqs, expected = _requests(tiny_llama, eos=False)
    cfg = WorkerConfig(
        model_dir=tiny_llama, max_total_token_num=pool, batch_max_tokens=64, disable_prompt_cache=not cache
    )
    engine = build_engine(cfg)
    got = run(engine, reqs)
    assert engine.scheduler.num_paused_total > 0
    if cache:
        assert engine.kv.cache is not None and engine.kv.cache.stats.evicted > pool
    for rid, want in expected.items():
        assert got[rid].tokens == want, f"request {rid}"
        assert got[rid].finish_reason == "length"
    assert engine.kv.available_tokens == engine.kv.capacity


def test_new_requests_join_a_running_batch(tiny_qwen: str) -> None:
    tok = hf_reference.tokenizer(tiny_qwen)
    engine = build_engine(WorkerConfig(model_dir=tiny_qwen))
    first = tok("The river was wide and calm.")["input_ids"]
    second = tok("Birds sat on its banks")["input_ids"]
    engine.add(request("a", first, max_new_tokens=20, ignore_eos=True))
    got: dict[str, list[int]] = {"a": [], "b": []}
    for step in range(40):
        if step == 5:
            engine.add(request("b", second, max_new_tokens=10, ignore_eos=True))
        if not engine.has_work():
            break
        out = engine.step()
        if step == 6:  # the newcomer's prefill ran in the same step as a's decode
            assert {item.rid for _, item in out.items} == {"a", "b"}
        for _, item in out.items:
            got[item.rid] += item.token_ids
    assert got["a"] == hf_reference.greedy(tiny_qwen, first, 20, eos=False)
    assert got["b"] == hf_reference.greedy(tiny_qwen, second, 10, eos=False)


def test_stop_token_ids_and_context_limit(tiny_llama: str) -> None:
    tok = hf_reference.tokenizer(tiny_llama)
    ids = tok("Hello world")["input_ids"]
    free_run = hf_reference.greedy(tiny_llama, ids, 12, eos=False)
    engine = build_engine(WorkerConfig(model_dir=tiny_llama, max_req_total_len=len(ids) + 4))
    got = run(engine, [request("ctx", ids, max_new_tokens=12, ignore_eos=True)])
    assert got["ctx"].tokens == free_run[:4] and got["ctx"].finish_reason == "length"
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    stop_at = free_run[5]
    got = run(engine, [request("s", ids, max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop_at])])
    first = free_run.index(stop_at)
    assert got["s"].tokens == free_run[: first + 1] and got["s"].finish_reason == "stop"


def test_abort_frees_kv_at_once(tiny_llama: str) -> None:
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    engine.add(request("x", list(range(3, 40)), max_new_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.kv.available_tokens < engine.kv.capacity
    assert engine.abort("x")
    assert engine.kv.available_tokens == engine.kv.capacity
    items = engine.step().items
    assert [(i.rid, i.finish_reason) for _, i in items] == [("x", "abort")]
