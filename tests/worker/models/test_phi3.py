"""The Phi-3 family (models/phi3.py) on the CPU path against Hugging Face's Phi3ForCausalLM:
every position's logits, from a prefill and from decode steps, with LongRoPE (the tiny model's)
and without; the fused checkpoint tensors' tensor-parallel shares; the folded norms; and the
config fields it reads, caps or refuses. Greedy outputs are compared with the other families'
in test_engine_vs_hf.py."""

from __future__ import annotations

import functools
import json
import math
import os
import shutil

import pytest
import torch
from safetensors import safe_open

from services.worker.build import build_engine
from services.worker.models.layers.rope import attention_scaling, cos_sin_table
from services.worker.models.llama import LlamaModel
from services.worker.models.registry import load_weights
from services.worker.runtime.folding import fold_norms_
from services.worker.tp.parallel import TensorParallel
from shared.config import WorkerConfig
from shared.model_config import ModelConfig, ModelConfigError
from tests import hf_reference
from tests.worker.teacher_forcing import decode_logits, prefill_logits

TEXTS = ("Once upon a time there was a small town by the sea", "Hello world, again and again")


@functools.cache
def _hf_model(model_dir: str):
    from transformers import Phi3ForCausalLM

    return Phi3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _hf_logits(model_dir: str, ids: list[int]) -> torch.Tensor:
    """[L, V] float32: Hugging Face's logits after each position of ids."""
    with torch.no_grad():
        return _hf_model(model_dir)(torch.tensor([ids])).logits[0]


@pytest.fixture(scope="module")
def tiny_phi3(tiny_models: dict[str, str]) -> str:
    return tiny_models["phi3"]


@pytest.fixture(scope="module")
def tiny_phi3_plain_rope(tiny_phi3: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with no rope scaling (Phi-3-mini-4k's kind) and a window under its context."""
    out = str(tmp_path_factory.mktemp("tiny-phi3-plain"))
    shutil.copytree(tiny_phi3, out, dirs_exist_ok=True)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(rope_scaling=None, sliding_window=cfg["max_position_embeddings"] - 1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f)
    return out


def _engine(model_dir: str):
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))


def test_the_tiny_model_exercises_what_sets_phi3_apart(tiny_phi3: str) -> None:
    cfg = ModelConfig.from_dir(tiny_phi3)
    assert cfg.family == "phi3" and not cfg.qkv_bias and not cfg.tie_word_embeddings
    assert cfg.rope_scaling["rope_type"] == "longrope" and cfg.rope_scaling["factor"] == 4.0
    assert cfg.context_length == cfg.rope_scaling["original_max_position_embeddings"] == 256  # the short factors' only
    assert attention_scaling(cfg.rope_scaling) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(256)))
    with safe_open(os.path.join(tiny_phi3, "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in names)
    model = _engine(tiny_phi3).runner.model
    assert type(model) is LlamaModel and model.folds_norms


def test_the_longrope_table_is_hfs(tiny_phi3: str) -> None:
    """cos and sin of every served position, the attention factor included, as Hugging Face's
    rotary embedding gives them for a sequence within the original context."""
    cfg = ModelConfig.from_dir(tiny_phi3)
    n = cfg.context_length
    table = cos_sin_table(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, n, "cpu")
    rotary = _hf_model(tiny_phi3).model.rotary_emb
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), torch.arange(n)[None])
    half = cfg.head_dim // 2
    assert torch.equal(table[:, :half], cos[0, :, :half]) and torch.equal(table[:, half:], sin[0, :, :half])


@pytest.mark.parametrize("variant", ["longrope", "plain"])
def test_prefill_logits_match_hf(tiny_phi3: str, tiny_phi3_plain_rope: str, variant: str) -> None:
    model_dir = tiny_phi3 if variant == "longrope" else tiny_phi3_plain_rope
    engine = _engine(model_dir)
    for text in TEXTS:
        ids = hf_reference.tokenizer(model_dir)(text)["input_ids"]
        torch.testing.assert_close(prefill_logits(engine, ids), _hf_logits(model_dir, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["longrope", "plain"])
def test_decode_logits_match_hf(tiny_phi3: str, tiny_phi3_plain_rope: str, variant: str) -> None:
    """Two requests a decode step: decode_attend rotates q and k with the LongRoPE table."""
    model_dir = tiny_phi3 if variant == "longrope" else tiny_phi3_plain_rope
    tok = hf_reference.tokenizer(model_dir)
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    got = decode_logits(_engine(model_dir), seqs, start=3)
    for ids, g in zip(seqs, got, strict=True):
        torch.testing.assert_close(g, _hf_logits(model_dir, ids)[3 : 3 + len(g)], rtol=1e-4, atol=1e-4)


def test_the_plain_variant_is_capped_at_its_window(tiny_phi3_plain_rope: str) -> None:
    cfg = ModelConfig.from_dir(tiny_phi3_plain_rope)
    assert cfg.rope_scaling == {} and cfg.context_length == 1023


def test_folded_decode_logits_equal_hfs(tiny_phi3: str) -> None:
    """The norms fold: a folded decode step (decode_folded, decode attention scaling q, k and v
    by the norm's factor before the LongRoPE rotary) gives Hugging Face's logits."""
    engine = _engine(tiny_phi3)
    assert fold_norms_(engine.runner.model)
    engine.runner.step.folded = True
    tok = hf_reference.tokenizer(tiny_phi3)
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    got = decode_logits(engine, seqs, start=3)
    for ids, g in zip(seqs, got, strict=True):
        torch.testing.assert_close(g, _hf_logits(tiny_phi3, ids)[3 : 3 + len(g)], rtol=1e-4, atol=1e-4)


def test_a_rank_takes_its_share_of_q_k_v_and_of_gate_and_up(tiny_phi3: str) -> None:
    """Two ranks: each holds its rows of q, of k and of v (not its half of the fused tensor),
    and of gate and of up."""
    cfg = ModelConfig.from_dir(tiny_phi3)
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    with safe_open(os.path.join(tiny_phi3, "model.safetensors"), framework="pt") as f:
        qkv = f.get_tensor("model.layers.1.self_attn.qkv_proj.weight")
        gate_up = f.get_tensor("model.layers.1.mlp.gate_up_proj.weight")
    q, k, v = qkv.split([q_rows, kv_rows, kv_rows])
    gate, up = gate_up.chunk(2)
    for rank in range(2):
        w = load_weights(tiny_phi3, cfg, torch.float32, "cpu", TensorParallel(rank, 2), progress=False)
        layer = w.layers[1]
        want_qkv = torch.cat([t.chunk(2)[rank] for t in (q, k, v)])
        assert torch.equal(layer.qkv, want_qkv) and layer.qkv.shape == (qkv.shape[0] // 2, cfg.hidden_size)
        assert torch.equal(layer.gate_up, torch.cat([gate.chunk(2)[rank], up.chunk(2)[rank]]))


# Phi-3-mini-128k-instruct's config.json, its factor lists shortened to a 16-wide head
PHI3 = {
    "architectures": ["Phi3ForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
    "sliding_window": 262144,
}


def test_a_128k_config_is_served_up_to_its_original_context() -> None:
    cfg = ModelConfig.from_dict(PHI3)
    assert cfg.context_length == 4096 and cfg.rope_scaling["factor"] == 32.0
    su = ModelConfig.from_dict({**PHI3, "rope_scaling": {**PHI3["rope_scaling"], "type": "su"}})
    assert su.rope_scaling["rope_type"] == "longrope" and su.context_length == 4096


def test_a_4k_config_is_capped_at_its_window() -> None:
    """Phi-3-mini-4k: no scaling, a window of 2047 under a context of 4096. Within 2047 tokens
    every position's window holds all its predecessors, so the capped context is exact."""
    cfg = ModelConfig.from_dict(
        {**PHI3, "max_position_embeddings": 4096, "rope_scaling": None, "sliding_window": 2047, "attention_bias": True}
    )
    assert cfg.context_length == 2047 and cfg.rope_scaling == {} and not cfg.qkv_bias


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"partial_rotary_factor": 0.75}, "partial_rotary_factor"),  # Phi-4-mini's
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 8}}, "short_factor"),
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8}}, "long_factor"),
        ({"original_max_position_embeddings": None}, "without original_max_position_embeddings"),
    ],
)
def test_what_the_kernels_cannot_do_is_refused(fields: dict, match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_dict({**PHI3, **fields})
