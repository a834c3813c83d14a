"""Prompt logprobs through the engine on the CPU: each prompt token's logprob (and the top
alternatives) equals Hugging Face's log-softmax under teacher forcing, however the prompt's
prefill is cut into chunks, with the prompt cache holding the prompt already, and across pauses."""

from __future__ import annotations

import pytest
import torch

from services.worker import prompt_logprobs
from services.worker.build import build_engine
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 5,
    "Once upon a time there was a small town by the sea.",
    "a",
]


def _run(engine, reqs) -> dict[str, dict]:
    """rid -> its first token's item's prompt logprobs (and tops), and the items' count of them."""
    out: dict[str, dict] = {r.rid: {"lp": [], "top": [], "ranks": [], "items": 0} for r in reqs}
    for r in reqs:
        engine.add(r)
    for _ in range(2000):
        if not engine.has_work():
            return out
        for _shard, item in engine.step().items:
            o = out[item.rid]
            if item.prompt_logprobs or item.prompt_top_logprobs:
                o["items"] += 1
                o["lp"], o["top"], o["ranks"] = item.prompt_logprobs, item.prompt_top_logprobs, item.prompt_ranks
    raise AssertionError("engine still busy")


def _check(model_dir: str, ids: list[int], got: dict, k: int) -> None:
    want = hf_reference.prompt_logprobs(model_dir, ids)  # [L - 1, V]
    chosen = want.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    assert len(got["lp"]) == len(ids) - 1 and got["items"] == (1 if len(ids) > 1 else 0)
    torch.testing.assert_close(torch.tensor(got["lp"]), chosen, atol=2e-4, rtol=1e-4)
    # each token's rank: 1 + the tokens more likely than it (ties of random weights are improbable)
    assert got["ranks"] == ((want > chosen[:, None]).sum(dim=-1) + 1).tolist()
    if k:
        assert len(got["top"]) == len(ids) - 1 and all(len(t) == k for t in got["top"])
        top_ids = torch.tensor([[int(t) for t, _ in row] for row in got["top"]])
        top_values = torch.tensor([[v for _, v in row] for row in got["top"]])
        torch.testing.assert_close(top_values, want.topk(k, dim=-1).values, atol=2e-4, rtol=1e-4)
        assert (want.gather(1, top_ids) - top_values).abs().max() < 2e-4  # the ids are the values' own


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
@pytest.mark.parametrize("budget", [8192, 16])
def test_prompt_logprobs_equal_hf(tiny_models: dict[str, str], arch: str, budget: int) -> None:
    """Whole prompts in one step, and chunks of 16 tokens (rows of several steps, in order)."""
    model_dir = tiny_models[arch]
    tok = hf_reference.tokenizer(model_dir)
    engine = build_engine(WorkerConfig(model_dir=model_dir, batch_max_tokens=budget))
    ids = [tok(t)["input_ids"] for t in TEXTS]
    reqs = [request(str(i), p, max_new_tokens=3, prompt_logprobs=i % 3) for i, p in enumerate(ids)]
    got = _run(engine, [*reqs, request("plain", ids[0], max_new_tokens=3)])
    for i, p in enumerate(ids):
        _check(model_dir, p, got[str(i)], i % 3)
    assert got["plain"]["items"] == 0  # none asked, none sent
    assert engine.kv.available_tokens == engine.kv.capacity


def test_a_cached_prompt_is_computed_again_for_its_logprobs(tiny_llama: str) -> None:
    """The prompt cache holds the whole prompt after the first request; the second still gets a
    row for every prompt token (it takes no prefix from the cache), the third, which asks for no
    prompt logprobs, reuses the cache."""
    tok = hf_reference.tokenizer(tiny_llama)
    ids = tok(TEXTS[0])["input_ids"]
    engine = build_engine(WorkerConfig(model_dir=tiny_llama))
    _run(engine, [request("warm", ids, max_new_tokens=2)])
    got = _run(engine, [request("again", ids, max_new_tokens=2, prompt_logprobs=1)])
    _check(tiny_llama, ids, got["again"], 1)
    engine.add(request("reuse", ids, max_new_tokens=2))
    engine.step()
    assert engine.scheduler.running[0].cached_len > 0


def test_rows_are_capped_per_step_and_survive_pauses(tiny_llama: str, monkeypatch) -> None:
    """With MAX_ROWS at 5 a step computes at most 5 rows (the prompts' chunks are cut to fit), and a
    pool too small for the batch pauses requests part-way: each prompt's logprobs still come once,
    complete and in order."""
    monkeypatch.setattr(prompt_logprobs, "MAX_ROWS", 5)
    tok = hf_reference.tokenizer(tiny_llama)
    ids = [tok(t)["input_ids"] for t in (*TEXTS[:2], TEXTS[0])]
    cfg = WorkerConfig(model_dir=tiny_llama, max_total_token_num=3 * len(ids[0]), batch_max_tokens=64)
    engine = build_engine(cfg)
    seen = []
    launch = engine._launch

    def spy(plan):
        seen.append(plan.prompt_rows)
        return launch(plan)

    monkeypatch.setattr(engine, "_launch", spy)
    new = len(ids[0])
    reqs = [request(f"r{i}", p, max_new_tokens=new, ignore_eos=True, prompt_logprobs=2) for i, p in enumerate(ids)]
    got = _run(engine, reqs)
    assert max(seen) == 5 and sum(seen) == sum(len(p) - 1 for p in ids)
    assert engine.scheduler.num_paused_total > 0
    for i, p in enumerate(ids):
        _check(tiny_llama, p, got[f"r{i}"], 2)
    assert engine.kv.available_tokens == engine.kv.capacity


def test_who_owes_rows() -> None:
    """A request that asks owes its prompt's rows; one handed over with output (its client has
    them already) or with images (pseudo-ids, not tokens, at their positions) owes none."""
    from services.worker.request import Req
    from shared.messages import GenerateReq, ImageRef, SamplingParams

    def req(ids: list[int], **kw) -> Req:
        return Req(GenerateReq("r", "f", "d", ids, SamplingParams(prompt_logprobs=1), 0.0, 0.0, **kw), 1)

    asked = req([5, 6, 7])
    assert prompt_logprobs.wants(asked) and list(prompt_logprobs.rows_in(asked, 0, 3)) == [0, 1]
    assert not prompt_logprobs.wants(req([5, 6, 7, 8], resumed=1))
    assert not prompt_logprobs.wants(req([5, -7, -7, 6], images=[ImageRef("h", 1, 2)]))
