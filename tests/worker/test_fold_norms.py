"""Norms folded into the weights (models/fold.py): the folded decode step on the CPU path
(TorchOps, the torch attention backend) gives Hugging Face's greedy output and the unfolded
model's logits. The CUDA path's folded steps are checked in test_cuda_path.py."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.fold import fold_norms_
from services.worker.models.llama import ModelWeights
from services.worker.models.loader import load_weights
from services.worker.parallel import TensorParallel
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run
from tests.worker.teacher_forcing import decode_logits


def _weights(model_dir: str) -> tuple[ModelConfig, ModelWeights]:
    cfg = ModelConfig.from_dir(model_dir)
    return cfg, load_weights(model_dir, cfg, torch.float32, torch.device("cpu"), TensorParallel())


def _folded_engine(model_dir: str):
    cfg, weights = _weights(model_dir)
    fold_norms_(weights)
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"), weights=weights, model_cfg=cfg)


def test_fold_moves_the_norm_weights_into_the_products(tiny_llama: str) -> None:
    _, plain = _weights(tiny_llama)
    _, folded = _weights(tiny_llama)
    fold_norms_(folded)
    fold_norms_(folded)  # a second fold changes nothing
    assert folded.folded and not plain.folded
    for p, f in zip(plain.layers, folded.layers, strict=True):
        torch.testing.assert_close(f.qkv, p.qkv * p.attn_norm[None, :])
        torch.testing.assert_close(f.gate_up, p.gate_up * p.mlp_norm[None, :])
        assert torch.equal(f.attn_norm, torch.ones_like(p.attn_norm))
        assert torch.equal(f.mlp_norm, torch.ones_like(p.mlp_norm))
        assert torch.equal(f.o, p.o) and torch.equal(f.down, p.down)
    assert torch.equal(folded.final_norm, plain.final_norm)


def test_fold_refuses_a_qkv_bias(tiny_qwen: str) -> None:
    _, weights = _weights(tiny_qwen)
    with pytest.raises(ValueError, match="QKV bias"):
        fold_norms_(weights)
    assert not weights.folded


def test_folded_decode_greedy_matches_hf(tiny_llama: str) -> None:
    tok = hf_reference.tokenizer(tiny_llama)
    texts = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 4, "def f(x): return", "a"]
    reqs, expected = [], {}
    for i, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=10 + 4 * i, ignore_eos=True))
        expected[str(i)] = hf_reference.greedy(tiny_llama, ids, 10 + 4 * i, eos=False)
    engine = _folded_engine(tiny_llama)
    assert engine.runner.model.w.folded
    got = run(engine, reqs)
    for rid, want in expected.items():
        assert got[rid].tokens == want, f"request {rid}"


@pytest.mark.parametrize("folded_max_batch", [64, 1])
def test_folded_decode_logits_equal_the_unfolded(tiny_llama: str, folded_max_batch: int, monkeypatch) -> None:
    """Under teacher forcing, each decode step's logits from the folded model equal the unfolded
    model's to float32 rounding: steps of two requests under decode_folded (no norm kernels, o
    and down added into the residual), and (a limit of 1) over the layers' unit norms."""
    import services.worker.models.llama as llama

    monkeypatch.setattr(llama, "FOLDED_MAX_BATCH", folded_max_batch)
    calls = []
    monkeypatch.setattr(llama.LlamaModel, "decode_folded", _counted(llama.LlamaModel.decode_folded, calls))
    tok = hf_reference.tokenizer(tiny_llama)
    seqs = [tok(t)["input_ids"] for t in ("Once upon a time there was a small town by the sea", "Hello world, again")]
    plain = build_engine(WorkerConfig(model_dir=tiny_llama, device="cpu"))
    want = decode_logits(plain, seqs, start=3)
    got = decode_logits(_folded_engine(tiny_llama), seqs, start=3)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert len(calls) == (len(got[0]) if folded_max_batch >= len(seqs) else 0)


def _counted(fn, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    return wrapped


def test_accumulating_names_the_products_a_decode_step_adds_into_the_residual(tiny_llama: str, monkeypatch) -> None:
    """The decode graphs time o and down adding into their output (blas_choice.choose) because a
    folded step runs them so; accumulating() must say what the step really does."""
    import services.worker.models.llama as llama

    seen: dict[str, set[bool]] = {}
    proj = llama.LlamaModel._proj

    def recorded(self, name, x, w, out=None, accumulate=False):
        seen.setdefault(name, set()).add(accumulate)
        return proj(self, name, x, w, out, accumulate)

    monkeypatch.setattr(llama.LlamaModel, "_proj", recorded)
    tok = hf_reference.tokenizer(tiny_llama)
    seqs = [tok(t)["input_ids"] for t in ("Once upon a time", "Hello world, again")]
    for engine in (_folded_engine(tiny_llama), build_engine(WorkerConfig(model_dir=tiny_llama, device="cpu"))):
        model = engine.runner.model
        seen.clear()
        decode_logits(engine, seqs, start=3)
        assert {name for name, modes in seen.items() if True in modes} == model.accumulating(len(seqs))
    assert model.accumulating(2) == frozenset()  # the plain model adds nothing into the residual in a product
    folded = _folded_engine(tiny_llama).runner.model
    assert folded.accumulating(llama.FOLDED_MAX_BATCH) == {"o", "down"}
    assert folded.accumulating(llama.FOLDED_MAX_BATCH + 1) == frozenset()
