"""What shared/model_config.py reads from a mixture of experts' config.json, as transformers
reads it (its defaults where a field is left out), and what it refuses."""

from __future__ import annotations

import pytest

from shared.model_config import ModelConfig, ModelConfigError

BASE = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
MIXTRAL = {**BASE, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "num_experts_per_tok": 2}
QWEN2_MOE = {**BASE, "architectures": ["Qwen2MoeForCausalLM"]}
QWEN3_MOE = {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "head_dim": 32}


def test_mixtral_experts_are_intermediate_size_wide_and_always_renormalised() -> None:
    cfg = ModelConfig.from_dict({**MIXTRAL, "norm_topk_prob": False, "sliding_window": 512})
    assert (cfg.family, cfg.num_experts, cfg.num_experts_per_tok) == ("mixtral", 8, 2)
    assert cfg.moe_intermediate_size == 128 and cfg.norm_topk_prob
    assert cfg.dense_layers == () and all(cfg.sparse(i) for i in range(4))
    assert cfg.shared_expert_intermediate_size == 0 and not cfg.qkv_bias
    assert cfg.max_position_embeddings == 512  # Mistral's window, capped as Mistral's


def test_qwen2_moe_defaults_are_transformers() -> None:
    cfg = ModelConfig.from_dict(QWEN2_MOE)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (60, 4, 1408)
    assert cfg.shared_expert_intermediate_size == 5632 and not cfg.norm_topk_prob
    assert cfg.qkv_bias  # Qwen1.5-MoE's config.json leaves qkv_bias out: true
    assert not ModelConfig.from_dict({**QWEN2_MOE, "qkv_bias": False}).qkv_bias


def test_qwen3_moe_renormalises_as_its_config_says() -> None:
    cfg = ModelConfig.from_dict(QWEN3_MOE)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 768)
    assert not cfg.norm_topk_prob and cfg.head_dim == 32 and not cfg.qkv_bias
    assert ModelConfig.from_dict({**QWEN3_MOE, "norm_topk_prob": True}).norm_topk_prob


@pytest.mark.parametrize(
    ("fields", "dense"),
    [
        ({"mlp_only_layers": [0, 3]}, (0, 3)),
        ({"decoder_sparse_step": 2}, (0, 2)),  # sparse where (layer + 1) % step == 0
        ({"decoder_sparse_step": 2, "mlp_only_layers": [1]}, (0, 1, 2)),
        ({"mlp_only_layers": None}, ()),
    ],
)
def test_dense_layers_among_sparse_ones(fields: dict, dense: tuple[int, ...]) -> None:
    for raw in (QWEN2_MOE, QWEN3_MOE):
        cfg = ModelConfig.from_dict({**raw, **fields})
        assert cfg.dense_layers == dense
        assert [cfg.sparse(i) for i in range(4)] == [i not in dense for i in range(4)]


def test_no_experts_makes_every_layer_dense() -> None:
    cfg = ModelConfig.from_dict({**QWEN2_MOE, "num_experts": 0})
    assert cfg.num_experts == 0 and not any(cfg.sparse(i) for i in range(4))


def test_a_dense_config_has_no_experts() -> None:
    cfg = ModelConfig.from_dict({**BASE, "architectures": ["LlamaForCausalLM"]})
    assert cfg.num_experts == 0 and not cfg.sparse(0)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({**MIXTRAL, "num_experts_per_tok": 9}, "between 1 and the 8 experts"),
        ({**MIXTRAL, "hidden_act": "gelu"}, "SiLU"),
        ({**QWEN3_MOE, "attention_bias": True}, "o_proj bias"),
        ({**QWEN2_MOE, "shared_expert_intermediate_size": 0}, "without a shared expert"),
        ({**QWEN2_MOE, "moe_intermediate_size": 0}, "must be positive"),
    ],
)
def test_what_the_kernels_cannot_do_is_refused(raw: dict, match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_dict(raw)
