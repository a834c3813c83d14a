"""The start-up warm-up: it runs its prompts alone, together and in a mixed step, then leaves
the engine as it found it, so what the engine serves next is what a fresh engine would."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.kernels import decode_combine, decode_split
from services.worker.runtime.piecewise_graphs import PiecewiseGraphs
from services.worker.runtime.warmup import ALONE, CONSTRAINED, TOGETHER, warm_up
from shared.config import WorkerConfig
from tests.worker.engine_driver import request, run


def _engine(model_dir: str):
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu", running_max_req_size=8))


def test_warm_up_runs_every_shape_and_leaves_the_engine_as_it_was(tiny_llama: str) -> None:
    engine = _engine(tiny_llama)
    free = engine.kv.free_tokens
    report = warm_up(engine, engine.runner.model.cfg.vocab_size)
    # one more with the prompt cache: a prompt that extends a cached one
    assert report.prompts == len(ALONE) + len(TOGETHER) + 1 + sum(CONSTRAINED) + (engine.kv.cache is not None)
    assert report.mixed_steps >= 1  # the late prompt's prefill ran beside the batch's decodes
    assert report.steps >= len(ALONE) * 2
    assert not engine.has_work() and engine.kv.free_tokens == free

    reqs = [request("a", [5, 9, 200, 14], max_new_tokens=12), request("b", list(range(3, 40)), max_new_tokens=7)]
    warmed = run(engine, reqs)
    fresh = run(_engine(tiny_llama), reqs)
    for r in reqs:
        assert warmed[r.rid].tokens == fresh[r.rid].tokens and len(fresh[r.rid].tokens) == r.params.max_new_tokens


def test_with_piecewise_graphs_it_also_runs_the_eager_steps_past_them(tiny_llama: str) -> None:
    engine = _engine(tiny_llama)
    model = engine.runner.model
    engine.runner.pieces = PiecewiseGraphs(
        model, model.attn.cache.dummy_slot, [8, 24], torch.device("cpu"), capture=False
    )
    eager: list[int] = []
    forward = model.forward

    def counted(batch):
        if batch.num_extends:  # (decode-only steps are the decode graphs' business)
            eager.append(batch.num_tokens)
        return forward(batch)

    model.forward = counted  # type: ignore[method-assign]
    report = warm_up(engine, model.cfg.vocab_size)
    assert report.prompts == len(ALONE) + len(TOGETHER) + 1 + sum(CONSTRAINED) + 2 + (engine.kv.cache is not None)
    # (the tiny buckets leave the longer warm-up prompts eager too)
    assert {24 + 16, 24 + 17} <= set(eager) and min(eager) > 24


SMALL = [{"max_req_total_len": 20}, {"max_req_total_len": 3}, {"running_max_req_size": 1}, {"max_total_token_num": 64}]


@pytest.mark.parametrize("limits", SMALL)
def test_warm_up_fits_a_small_worker(tiny_llama: str, limits: dict) -> None:
    # short request rows, one request at a time, a pool smaller than the prompts together
    engine = build_engine(WorkerConfig(model_dir=tiny_llama, device="cpu", **limits))
    free = engine.kv.free_tokens
    report = warm_up(engine, engine.runner.model.cfg.vocab_size)
    # one more with the prompt cache: a prompt that extends a cached one
    assert report.prompts == len(ALONE) + len(TOGETHER) + 1 + sum(CONSTRAINED) + (engine.kv.cache is not None)
    assert not engine.has_work() and engine.kv.free_tokens == free


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_after_the_warm_up_mixed_steps_compile_no_decode_attention(tiny_llama: str) -> None:
    """A prompt arriving while long requests decode: the step's decode attention (eager, its
    tokens rotated and stored before it) splits each context, and must run kernels that
    capturing the decode graphs (which rotate and store inside the kernel) already compiled."""
    cfg = WorkerConfig(
        model_dir=tiny_llama, device="cuda", dtype="bfloat16", cuda_graph_max_bs=8, max_total_token_num=8192
    )
    engine = build_engine(cfg)
    vocab = engine.runner.model.cfg.vocab_size
    warm_up(engine, vocab)
    launchers = (decode_split.split_launch, decode_combine._decode_reduce_launch)
    before = [set(launcher.compiled) for launcher in launchers]
    mixed = 0
    for length in (300, 900):  # the first decodes alone in a few splits, then beside the second
        engine.add(
            request(f"long-{length}", [(7 * i) % vocab for i in range(length)], max_new_tokens=12, ignore_eos=True)
        )
        for _ in range(3):
            engine.step()
        engine.add(request(f"late-{length}", [3, 5, 8, 13], max_new_tokens=2, ignore_eos=True))
        for _ in range(3):
            out = engine.step()
            mixed += 0 < out.num_decodes < out.num_tokens
    while engine.has_work():
        engine.step()
    assert mixed >= 2
    new = [sorted(map(str, set(launcher.compiled) - seen)) for launcher, seen in zip(launchers, before, strict=True)]
    for keys, seen in zip(new, before, strict=True):
        for key in keys:  # the whole key, next to the compiled ones, for whoever must find what differs
            print("new key:", key, "\ncompiled:", *map(str, seen), sep="\n")
    assert new == [[], []], new
