"""The Qwen3 family (models/qwen3.py) on the CPU path against Hugging Face's Qwen3ForCausalLM:
every position's logits, from a prefill and from decode steps (where the attention backend
rotates and stores), and the config fields it reads or refuses. Greedy outputs are compared
with the other families' in test_engine_vs_hf.py."""

from __future__ import annotations

import functools

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.qwen3 import Qwen3LayerWeights, Qwen3Model
from services.worker.runtime.folding import fold_norms_
from shared.config import WorkerConfig
from shared.model_config import ModelConfig, ModelConfigError
from tests import hf_reference
from tests.worker.teacher_forcing import decode_logits, prefill_logits

TEXTS = ("Once upon a time there was a small town by the sea", "Hello world, again and again")


@functools.cache
def _hf_model(model_dir: str):
    from transformers import Qwen3ForCausalLM

    return Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _hf_logits(model_dir: str, ids: list[int]) -> torch.Tensor:
    """[L, V] float32: Hugging Face's logits after each position of ids."""
    with torch.no_grad():
        return _hf_model(model_dir)(torch.tensor([ids])).logits[0]


@pytest.fixture(scope="module")
def tiny_qwen3(tiny_models: dict[str, str]) -> str:
    return tiny_models["qwen3"]


def _engine(model_dir: str):
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))


def test_the_tiny_model_exercises_what_sets_qwen3_apart(tiny_qwen3: str) -> None:
    cfg = ModelConfig.from_dir(tiny_qwen3)
    assert cfg.family == "qwen3" and not cfg.qkv_bias
    assert cfg.head_dim * cfg.num_heads != cfg.hidden_size  # head_dim from config.json, not hidden / heads
    model = _engine(tiny_qwen3).runner.model
    assert isinstance(model, Qwen3Model)
    assert all(isinstance(layer, Qwen3LayerWeights) for layer in model.w.layers)
    assert model.w.layers[0].q_norm.shape == (cfg.head_dim,)


def test_prefill_logits_match_hf(tiny_qwen3: str) -> None:
    engine = _engine(tiny_qwen3)
    for text in TEXTS:
        ids = hf_reference.tokenizer(tiny_qwen3)(text)["input_ids"]
        torch.testing.assert_close(prefill_logits(engine, ids), _hf_logits(tiny_qwen3, ids), rtol=1e-4, atol=1e-4)


def test_decode_logits_match_hf(tiny_qwen3: str) -> None:
    """Two requests a decode step: q and k head-normed before decode_attend rotates them."""
    tok = hf_reference.tokenizer(tiny_qwen3)
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    got = decode_logits(_engine(tiny_qwen3), seqs, start=3)
    for ids, g in zip(seqs, got, strict=True):
        want = _hf_logits(tiny_qwen3, ids)[3 : 3 + len(g)]
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-4)


def test_the_head_norms_are_not_folded(tiny_qwen3: str) -> None:
    model = _engine(tiny_qwen3).runner.model
    norms = [layer.attn_norm.clone() for layer in model.w.layers]
    assert not model.folds_norms and model.fold_pairs() == [] and not fold_norms_(model)
    assert all(torch.equal(n, layer.attn_norm) for n, layer in zip(norms, model.w.layers, strict=True))


QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "sliding_window": 4096,  # Hugging Face's default, off while use_sliding_window is false
}


def test_a_config_with_its_window_off_is_read() -> None:
    cfg = ModelConfig.from_dict({**QWEN3, "use_sliding_window": False, "layer_types": ["full_attention"] * 2})
    assert cfg.family == "qwen3" and cfg.head_dim == 32 and not cfg.qkv_bias
    assert cfg.max_position_embeddings == 2048  # not cut to the window


@pytest.mark.parametrize(
    "fields",
    [
        {"use_sliding_window": True},
        {"layer_types": ["full_attention", "sliding_attention"]},
        {"layer_types": ["full_attention", "chunked_attention"]},  # a layer type not known here
    ],
)
def test_a_sliding_window_or_an_unknown_layer_type_is_refused(fields: dict) -> None:
    with pytest.raises(ModelConfigError, match="full attention only"):
        ModelConfig.from_dict({**QWEN3, **fields})
