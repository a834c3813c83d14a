"""Norms folded into the weights (runtime/folding.py): the folded decode step on the CPU path
(TorchOps, the torch attention backend) gives Hugging Face's greedy output and the unfolded
model's logits. The CUDA path's folded steps are checked in test_cuda_path.py."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.layers.projection import matmul
from services.worker.models.registry import load_weights
from services.worker.models.weights import ModelWeights
from services.worker.runtime import folding
from services.worker.runtime.folding import fold_norms_
from services.worker.tp.parallel import TensorParallel
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run
from tests.worker.teacher_forcing import decode_logits


def _weights(model_dir: str) -> tuple[ModelConfig, ModelWeights]:
    cfg = ModelConfig.from_dir(model_dir)
    return cfg, load_weights(model_dir, cfg, torch.float32, torch.device("cpu"), TensorParallel())


def _engine(model_dir: str):
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))


def _folded_engine(model_dir: str):
    """The CPU engine with its model's norms folded and its steps choosing decode_folded (on the
    CPU the runtime folds nothing of its own accord: wants_folding is for one CUDA rank)."""
    engine = _engine(model_dir)
    assert fold_norms_(engine.runner.model)
    engine.runner.step.folded = True
    return engine


def test_fold_moves_the_norm_weights_into_the_products(tiny_llama: str) -> None:
    _, plain = _weights(tiny_llama)
    model = _engine(tiny_llama).runner.model
    assert fold_norms_(model)
    assert fold_norms_(model)  # a second fold changes nothing: the norms are ones
    folded = model.w
    for p, f in zip(plain.layers, folded.layers, strict=True):
        torch.testing.assert_close(f.qkv, p.qkv * p.attn_norm[None, :])
        torch.testing.assert_close(f.gate_up, p.gate_up * p.mlp_norm[None, :])
        assert torch.equal(f.attn_norm, torch.ones_like(p.attn_norm))
        assert torch.equal(f.mlp_norm, torch.ones_like(p.mlp_norm))
        assert torch.equal(f.o, p.o) and torch.equal(f.down, p.down)
    assert torch.equal(folded.final_norm, plain.final_norm)


def test_a_qkv_bias_is_not_folded(tiny_qwen: str) -> None:
    """r * (x @ W.t()) + b is not (r x g) @ W.t() + b: a family with a QKV bias declares no pairs."""
    _, plain = _weights(tiny_qwen)
    model = _engine(tiny_qwen).runner.model
    assert model.fold_pairs() == [] and not fold_norms_(model)
    for p, f in zip(plain.layers, model.w.layers, strict=True):
        assert torch.equal(f.qkv, p.qkv) and torch.equal(f.attn_norm, p.attn_norm)


def test_folded_decode_greedy_matches_hf(tiny_llama: str) -> None:
    tok = hf_reference.tokenizer(tiny_llama)
    texts = ["Hello world", "The quick brown fox jumps over the lazy dog. " * 4, "def f(x): return", "a"]
    reqs, expected = [], {}
    for i, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=10 + 4 * i, ignore_eos=True))
        expected[str(i)] = hf_reference.greedy(tiny_llama, ids, 10 + 4 * i, eos=False)
    engine = _folded_engine(tiny_llama)
    assert engine.runner.step.folded
    got = run(engine, reqs)
    for rid, want in expected.items():
        assert got[rid].tokens == want, f"request {rid}"


@pytest.mark.parametrize("folded_max_batch", [64, 1])
def test_folded_decode_logits_equal_the_unfolded(tiny_llama: str, folded_max_batch: int, monkeypatch) -> None:
    """Under teacher forcing, each decode step's logits from the folded model equal the unfolded
    model's to float32 rounding: steps of two requests under decode_folded (no norm kernels, o
    and down added into the residual), and (a limit of 1) over the layers' unit norms."""
    import services.worker.models.llama as llama

    monkeypatch.setattr(folding, "FOLDED_MAX_BATCH", folded_max_batch)
    calls = []
    monkeypatch.setattr(llama.LlamaModel, "decode_folded", _counted(llama.LlamaModel.decode_folded, calls))
    tok = hf_reference.tokenizer(tiny_llama)
    seqs = [tok(t)["input_ids"] for t in ("Once upon a time there was a small town by the sea", "Hello world, again")]
    plain = _engine(tiny_llama)
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


def test_accumulating_names_the_products_a_decode_step_adds_into_the_residual(tiny_llama: str) -> None:
    """The decode graphs time o and down adding into their output (blas_choice.choose) because a
    folded step runs them so; accumulating() must say what the step really does."""
    seen: dict[str, set[bool]] = {}

    def recorded(name, x, w, out=None, accumulate=False):
        seen.setdefault(name, set()).add(accumulate)
        return matmul(x, w, out, accumulate)

    tok = hf_reference.tokenizer(tiny_llama)
    seqs = [tok(t)["input_ids"] for t in ("Once upon a time", "Hello world, again")]
    for engine in (_folded_engine(tiny_llama), _engine(tiny_llama)):
        engine.runner.model.project = recorded
        seen.clear()
        decode_logits(engine, seqs, start=3)
        assert {name for name, modes in seen.items() if True in modes} == engine.runner.step.accumulating(len(seqs))
    assert engine.runner.step.accumulating(2) == frozenset()  # the plain model adds nothing into the residual
    folded = _folded_engine(tiny_llama).runner.step
    assert folded.accumulating(folding.FOLDED_MAX_BATCH) == {"o", "down"}
    assert folded.accumulating(folding.FOLDED_MAX_BATCH + 1) == frozenset()
