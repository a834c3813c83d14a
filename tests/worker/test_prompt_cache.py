"""The prompt cache in the engine (services/worker/memory/prompt_cache.py): greedy outputs with
the cache equal Hugging Face's for prompts that share prefixes of every kind, and no KV slot
is lost: once nothing runs, free plus evictable tokens are the whole pool."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.engine import Engine
from services.worker.prefill_sharing import BLOCK
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run

TEXT = "Once upon a time there was a small town by the sea. Every morning the fishermen went out " * 2


# on CUDA in float32 (Triton kernels, decode graphs, piecewise graphs): exact against Hugging Face too
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


def _engine(model_dir: str, device: str = "cpu", **cfg) -> Engine:
    if device == "cuda":
        cfg = {"dtype": "float32", "max_total_token_num": 65536, **cfg}
    return build_engine(WorkerConfig(model_dir=model_dir, device=device, **cfg))


def _check(model_dir: str, engine: Engine, reqs, got) -> None:
    for r in reqs:
        want = hf_reference.greedy(model_dir, list(r.input_ids), r.params.max_new_tokens, eos=False)
        assert got[r.rid].tokens == want, r.rid
    kv = engine.kv
    assert not engine.has_work()
    assert kv.available_tokens == kv.capacity and kv.cache_locked_tokens == 0  # no slot leaked
    assert kv.table.num_free_rows == kv.table.max_rows


def _ids(model_dir: str) -> list[int]:
    ids = hf_reference.tokenizer(model_dir)(TEXT)["input_ids"]
    assert len(ids) > 40
    return ids


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8"])
def test_prefixes_of_every_length_give_hugging_faces_output(tiny_llama: str, kv_dtype: str, device: str) -> None:
    """A first request is cached; then prompts sharing its first token, a prefix ending inside a
    prefill chunk, the whole prompt, and the prompt with its output and more."""
    ids = _ids(tiny_llama)
    engine = _engine(tiny_llama, device, batch_max_tokens=16, kv_dtype=kv_dtype)
    first = request("first", ids, max_new_tokens=8, ignore_eos=True)
    out = run(engine, [first])
    if kv_dtype == "auto":  # int8 and e4m3 K and V round: its own first output is checked below
        assert out["first"].tokens == hf_reference.greedy(tiny_llama, ids, 8, eos=False)
    grown = ids + out["first"].tokens + [17, 23, 99]
    reqs = [
        request("one", [*ids[:1], 5, 6, 7, 8], max_new_tokens=6, ignore_eos=True),
        request("mid-chunk", [*ids[:21], 44, 45], max_new_tokens=6, ignore_eos=True),
        request("whole", ids, max_new_tokens=8, ignore_eos=True),
        request("longer", grown, max_new_tokens=6, ignore_eos=True),
    ]
    got = run(engine, reqs)
    cached = {rid: o.cached_tokens for rid, o in got.items()}
    # the last prompt token is always run (its logits give the first output); of "first"'s output,
    # the tokens fed back before it ended (the last two were in flight when its KV went back)
    assert cached == {"one": 1, "mid-chunk": 21, "whole": len(ids) - 1, "longer": len(ids) + 6}
    for r in reqs:
        assert got[r.rid].tokens and len(got[r.rid].tokens) == r.params.max_new_tokens
    if kv_dtype == "auto":
        _check(tiny_llama, engine, reqs, got)
    else:  # int8: the same outputs as the same prompts without the cache, which holds int8 KV too
        plain = _engine(tiny_llama, device, batch_max_tokens=16, kv_dtype=kv_dtype, disable_prompt_cache=True)
        want = run(plain, [first, *reqs])
        assert {r.rid: got[r.rid].tokens for r in reqs} == {r.rid: want[r.rid].tokens for r in reqs}
        assert out["first"].tokens == want["first"].tokens
        assert engine.kv.available_tokens == engine.kv.capacity


@pytest.mark.parametrize("device", DEVICES)
def test_requests_arriving_while_their_prefix_is_still_being_prefilled(tiny_llama: str, device: str) -> None:
    """A 16-token budget prefills the first prompt over several steps; requests sharing parts of it
    arrive after one and after two of them and take what is cached so far."""
    ids = _ids(tiny_llama)
    engine = _engine(tiny_llama, device, batch_max_tokens=16)
    reqs = [request("first", ids, max_new_tokens=6, ignore_eos=True)]
    later = {
        1: [request("after-one", [*ids[:30], 7, 8, 9], max_new_tokens=6, ignore_eos=True)],
        2: [request("after-two", [*ids, 11, 12], max_new_tokens=6, ignore_eos=True)],
        3: [request("twin", list(ids), max_new_tokens=6, ignore_eos=True)],
    }
    all_reqs = reqs + [r for rs in later.values() for r in rs]
    got = run(engine, reqs, later=later)
    assert engine.kv.cache.stats.hits >= 16
    _check(tiny_llama, engine, all_reqs, got)


@pytest.mark.parametrize("device", DEVICES)
def test_requests_sharing_an_uncached_prefix_start_one_after_the_other(tiny_llama: str, device: str) -> None:
    """Three requests arrive together with a shared prefix of several blocks that nothing cached:
    the first computes it and the other two wait a step and reuse it (prefill_sharing.py); a
    request sharing nothing starts at once, in the first step."""
    ids = _ids(tiny_llama)
    prefix = (ids * 4)[: 2 * BLOCK + 10]
    reqs = [request(f"share-{i}", [*prefix, 200 + i, 300 + i], max_new_tokens=5, ignore_eos=True) for i in range(3)]
    reqs.append(request("alone", [7, *ids[1:]], max_new_tokens=5, ignore_eos=True))
    engine = _engine(tiny_llama, device, batch_max_tokens=4096)
    started = []
    step = engine.scheduler.schedule

    def schedule():
        plan = step()
        started.append(sorted(r.rid for r in plan.new_rows))
        return plan

    engine.scheduler.schedule = schedule
    got = run(engine, reqs)
    assert started[:2] == [["alone", "share-0"], ["share-1", "share-2"]]
    assert engine.scheduler.num_held_back_total == 2
    assert [got[f"share-{i}"].cached_tokens for i in (1, 2)] == [len(prefix), len(prefix)]
    _check(tiny_llama, engine, reqs, got)


@pytest.mark.parametrize("device", DEVICES)
def test_a_pool_so_small_that_eviction_runs_on_most_steps(tiny_llama: str, device: str) -> None:
    ids = _ids(tiny_llama)
    engine = _engine(tiny_llama, device, batch_max_tokens=32, max_total_token_num=64)
    reqs = [
        request(
            str(i),
            ids[: 3 + 4 * (i % 6)] + [100 + 13 * i + j for j in range(12)],
            max_new_tokens=6 + i % 4,
            ignore_eos=True,
        )
        for i in range(12)
    ]
    got = run(engine, reqs)
    assert engine.kv.cache.stats.evicted > 2 * engine.kv.capacity
    assert sum(o.cached_tokens for o in got.values()) > 0
    _check(tiny_llama, engine, reqs, got)


def test_the_cache_switched_off_reuses_nothing(tiny_llama: str) -> None:
    ids = _ids(tiny_llama)
    engine = _engine(tiny_llama, disable_prompt_cache=True)
    assert engine.kv.cache is None
    reqs = [request("a", ids, max_new_tokens=4, ignore_eos=True), request("b", ids, max_new_tokens=4, ignore_eos=True)]
    got = run(engine, reqs[:1])
    got |= run(engine, reqs[1:])
    assert engine.kv.free_tokens == engine.kv.capacity and engine.kv.evictable_tokens == 0
    assert got["a"].tokens == got["b"].tokens
