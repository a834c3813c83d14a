"""Gemma 2 and 3 through the engine: greedy outputs equal Hugging Face's (eager attention: Gemma
2's soft cap applies) for prompts several times the tiny models' 8-token window, prefilled
whole and in 16-token chunks beside other requests' decodes, and with the prompt cache on (a
second round of prompts sharing prefixes of the first's, ending inside and beyond a window).
On CUDA in float32 (Triton kernels, decode graphs, piecewise graphs) the same, exactly."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.engine import Engine
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run

GEMMA = ("gemma2", "gemma3")
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "Once upon a time there was a small town by the sea. Every morning the fishermen",
    "def greet(name):\n    return 'Hello, ' + name + '! How are you today?'\n\nprint(greet(",
    "Question: What is the capital of France? Answer:",
    "a",
]
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
    ),
]


def _engine(model_dir: str, device: str, **cfg) -> Engine:
    if device == "cuda":
        cfg = {"dtype": "float32", "max_total_token_num": 65536, **cfg}
    return build_engine(WorkerConfig(model_dir=model_dir, device=device, **cfg))


def _check(model_dir: str, engine: Engine, reqs, got) -> None:
    for r in reqs:
        want = hf_reference.greedy(model_dir, list(r.input_ids), r.params.max_new_tokens, eos=False)
        assert got[r.rid].tokens == want, r.rid
    assert not engine.has_work() and engine.kv.available_tokens == engine.kv.capacity  # no slot leaked


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("budget", [8192, 16])
@pytest.mark.parametrize("arch", GEMMA)
def test_greedy_matches_hf(tiny_models: dict[str, str], arch: str, budget: int, device: str) -> None:
    model_dir = tiny_models[arch]
    tok = hf_reference.tokenizer(model_dir)
    reqs = [
        request(str(i), tok(t)["input_ids"], max_new_tokens=10 + 5 * i, ignore_eos=True) for i, t in enumerate(PROMPTS)
    ]
    assert sum(len(r.input_ids) > 2 * 8 for r in reqs) >= 3  # most prompts outrun the window
    engine = _engine(model_dir, device, batch_max_tokens=budget)
    _check(model_dir, engine, reqs, run(engine, reqs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", GEMMA)
def test_a_second_round_sharing_prefixes_uses_the_cache(tiny_models: dict[str, str], arch: str, device: str) -> None:
    """The first round is cached; the second's prompts share its first token, a prefix ending
    inside the last window of the first prompt, its whole prompt, and the prompt with its output
    and more; chunked (16 tokens a step), so cached prefixes meet chunk boundaries."""
    model_dir = tiny_models[arch]
    tok = hf_reference.tokenizer(model_dir)
    first, second = (tok(t)["input_ids"] for t in PROMPTS[:2])
    engine = _engine(model_dir, device, batch_max_tokens=16)
    round1 = [
        request("first", first, max_new_tokens=8, ignore_eos=True),
        request("second", second, max_new_tokens=8, ignore_eos=True),
    ]
    out = run(engine, round1)
    _check(model_dir, engine, round1, out)
    round2 = [
        request("one", [*first[:1], 5, 6, 7, 8], max_new_tokens=6, ignore_eos=True),
        request("in-window", [*first[: len(first) - 3], 44, 45], max_new_tokens=9, ignore_eos=True),
        request("whole", first, max_new_tokens=8, ignore_eos=True),
        request("longer", [*second, *out["second"].tokens, 17, 23, 99], max_new_tokens=12, ignore_eos=True),
    ]
    got = run(engine, round2)
    cached = {rid: o.cached_tokens for rid, o in got.items()}
    assert cached["one"] == 1 and cached["in-window"] == len(first) - 3 and cached["whole"] == len(first) - 1
    assert cached["longer"] > len(second)
    _check(model_dir, engine, round2, got)
