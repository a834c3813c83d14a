"""The Gemma 2 and Gemma 3 families (models/gemma2.py, gemma3.py) on the CPU path against Hugging
Face's Gemma2ForCausalLM and Gemma3ForCausalLM (eager attention, so Gemma 2's soft cap applies):
every position's logits, from a prefill and from decode steps (where the attention backend
rotates and stores), over sequences three times the tiny models' 8-token window; and the parts
that set Gemma apart. Greedy outputs, in chunks and with the prompt cache, are compared in
tests/worker/test_gemma_vs_hf.py."""

from __future__ import annotations

import functools

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.attention.base import LayerAttention
from services.worker.models.gemma2 import Gemma2Model, GemmaLayerWeights
from services.worker.models.gemma3 import Gemma3LayerWeights, Gemma3Model
from services.worker.runtime.folding import fold_norms_
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from tests import hf_reference
from tests.worker.teacher_forcing import decode_logits, prefill_logits

TEXTS = (
    "Once upon a time there was a small town by the sea. Every morning the fishermen",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over",
)
GEMMA = ("gemma2", "gemma3")


@functools.cache
def _hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()


def _hf_logits(model_dir: str, ids: list[int]) -> torch.Tensor:
    """[L, V] float32: Hugging Face's logits after each position of ids."""
    with torch.no_grad():
        return _hf_model(model_dir)(torch.tensor([ids])).logits[0]


def _engine(model_dir: str):
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))


def _ids(model_dir: str) -> list[list[int]]:
    seqs = [hf_reference.tokenizer(model_dir)(t)["input_ids"] for t in TEXTS]
    assert min(map(len, seqs)) >= 3 * 8  # the window matters
    return seqs


def test_tiny_gemma2_exercises_what_sets_it_apart(tiny_models: dict[str, str]) -> None:
    cfg = ModelConfig.from_dir(tiny_models["gemma2"])
    assert cfg.layer_windows == (8, 0, 8, 0) and cfg.tie_word_embeddings
    assert cfg.attn_logit_softcap > 0 and cfg.final_logit_softcap > 0
    assert cfg.query_pre_attn_scalar != cfg.head_dim
    model = _engine(tiny_models["gemma2"]).runner.model
    assert type(model) is Gemma2Model
    assert all(type(layer) is GemmaLayerWeights for layer in model.w.layers)
    scale = cfg.query_pre_attn_scalar**-0.5
    assert model.attn.layers == tuple(LayerAttention(scale, w, cfg.attn_logit_softcap) for w in (8, 0, 8, 0))
    assert model.embed_scale == 8.0  # sqrt(64)


def test_tiny_gemma3_exercises_what_sets_it_apart(tiny_models: dict[str, str]) -> None:
    cfg = ModelConfig.from_dir(tiny_models["gemma3"])
    assert cfg.layer_windows == (8, 8, 8, 0) and cfg.head_dim * cfg.num_heads != cfg.hidden_size
    assert cfg.attn_logit_softcap == 0 and cfg.rope_scaling["rope_type"] == "linear"
    model = _engine(tiny_models["gemma3"]).runner.model
    assert type(model) is Gemma3Model
    assert all(type(layer) is Gemma3LayerWeights for layer in model.w.layers)
    assert model.w.layers[0].q_norm.shape == (cfg.head_dim,)
    assert model.cos_sin_of(0) is model.cos_sin_local and model.cos_sin_of(3) is model.cos_sin
    assert not torch.equal(model.cos_sin_local[5], model.cos_sin[5])  # own base, unscaled


@pytest.mark.parametrize("arch", GEMMA)
def test_prefill_logits_match_hf(tiny_models: dict[str, str], arch: str) -> None:
    engine = _engine(tiny_models[arch])
    for ids in _ids(tiny_models[arch]):
        want = _hf_logits(tiny_models[arch], ids)
        torch.testing.assert_close(prefill_logits(engine, ids), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", GEMMA)
def test_decode_logits_match_hf(tiny_models: dict[str, str], arch: str) -> None:
    """Two requests a decode step, through and past the window: q and k (Gemma 3: head-normed) go
    unrotated to decode_attend, which turns them by their layer's table and stores them."""
    model_dir = tiny_models[arch]
    seqs = _ids(model_dir)
    got = decode_logits(_engine(model_dir), seqs, start=3)
    for ids, g in zip(seqs, got, strict=True):
        torch.testing.assert_close(g, _hf_logits(model_dir, ids)[3 : 3 + len(g)], rtol=1e-4, atol=1e-4)


def test_gemma2_logits_are_soft_capped(tiny_models: dict[str, str]) -> None:
    cap = ModelConfig.from_dir(tiny_models["gemma2"]).final_logit_softcap
    logits = prefill_logits(_engine(tiny_models["gemma2"]), _ids(tiny_models["gemma2"])[0])
    assert logits.abs().max() < cap and logits.abs().max() > 0.9 * cap  # reached, never passed


@pytest.mark.parametrize("arch", GEMMA)
def test_the_norms_are_not_folded(tiny_models: dict[str, str], arch: str) -> None:
    model = _engine(tiny_models[arch]).runner.model
    norms = [layer.attn_norm.clone() for layer in model.w.layers]
    assert not model.folds_norms and model.fold_pairs() == [] and not fold_norms_(model)
    assert all(torch.equal(n, layer.attn_norm) for n, layer in zip(norms, model.w.layers, strict=True))
    with pytest.raises(NotImplementedError, match="do not fold"):
        model.decode_folded(None)
