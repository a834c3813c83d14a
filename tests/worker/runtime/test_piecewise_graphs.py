"""The piecewise runner (services/worker/runtime/piecewise_graphs.py) on the CPU: the same pieces,
static buffers and padding a captured run replays, run eagerly, against the plain forward.
The captured graphs themselves are checked on the GPU (test_cuda_path.py)."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.runtime.piecewise_graphs import PiecewiseGraphs, token_buckets_up_to
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run
from tests.worker.teacher_forcing import prefill_logits

BUCKETS = [8, 24, 64]


def _with_pieces(model_dir: str, **cfg) -> tuple:
    engine = build_engine(WorkerConfig(model_dir=model_dir, device="cpu", **cfg))
    model = engine.runner.model
    pieces = PiecewiseGraphs(model, model.attn.cache.dummy_slot, BUCKETS, torch.device("cpu"), capture=False)
    engine.runner.pieces = pieces
    used: list[int] = []  # the token count of every step the pieces ran
    run_pieces = pieces.run

    def counted(batch):
        used.append(batch.num_tokens)
        return run_pieces(batch)

    pieces.run = counted  # type: ignore[method-assign]
    return engine, used


def test_buckets_end_at_the_limit() -> None:
    assert token_buckets_up_to(100) == [16, 32, 48, 64, 96, 100]
    assert token_buckets_up_to(2048)[-1] == 2048
    assert token_buckets_up_to(0) == []


# Gemma's pieces: post-norms, windows (8 tokens) and Gemma 3's head norms over the static buffers
ARCHS = ["llama", "gemma2", "gemma3"]


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_pieces_give_the_plain_forwards_logits(tiny_models: dict[str, str], arch: str) -> None:
    ids = list(range(3, 23))  # 20 tokens: padded to the 24-token bucket
    engine, used = _with_pieces(tiny_models[arch])
    plain = build_engine(WorkerConfig(model_dir=tiny_models[arch], device="cpu"))
    got, want = prefill_logits(engine, ids), prefill_logits(plain, ids)
    assert used == [20]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_and_chunked_steps_through_the_pieces_match_hugging_face(tiny_models: dict[str, str], arch: str) -> None:
    """A 16-token prefill budget chunks the longer prompts across steps that also decode the
    others; those steps go through the pieces, in buckets of 8 and 24 tokens. Slots a larger step
    left in the padding would overwrite other requests' KV: the outputs would differ."""
    tiny = tiny_models[arch]
    tok = hf_reference.tokenizer(tiny)
    texts = [
        "Hello world",
        "The quick brown fox jumps over the lazy dog. " * 3,
        "a",
        "Once upon a time",
        "def f(x): return x * x  # a function",
    ]
    # no end at EOS: every family's steps have the same sizes
    reqs = [
        request(str(i), tok(t)["input_ids"], max_new_tokens=6 + 5 * i, ignore_eos=True) for i, t in enumerate(texts)
    ]
    # the cache off: shared first tokens would change which steps are small
    engine, used = _with_pieces(tiny, batch_max_tokens=16, disable_prompt_cache=True)
    out = run(engine, reqs)
    assert min(used) <= 8 and max(used) > 8 and len(used) >= 5
    for r in reqs:
        want = hf_reference.greedy(tiny, list(r.input_ids), r.params.max_new_tokens, eos=False)
        assert out[r.rid].tokens == want, r.rid


def test_steps_past_the_largest_bucket_and_decode_only_steps_run_eagerly(tiny_llama: str) -> None:
    engine, used = _with_pieces(tiny_llama)
    ids = list(range(3, 3 + 70))
    out = run(engine, [request("long", ids, max_new_tokens=3)])
    assert used == []  # the 70-token prefill, and its decode steps (decode graphs' business)
    assert out["long"].tokens == hf_reference.greedy(tiny_llama, ids, 3)
