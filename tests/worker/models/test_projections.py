"""Which checkpoint tensors are a decoder layer's projections (models/projections.py): what the
tiny quantized checkpoints store quantized and --quantization fp8 quantizes at load."""

from __future__ import annotations

import pytest

from services.worker.models.projections import is_projection


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
        "model.layers.0.self_attn.qkv_proj.weight",  # Phi-3's fused
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.1.block_sparse_moe.experts.7.w2.weight",  # Mixtral's routed experts
        "model.layers.1.mlp.experts.0.gate_proj.weight",
        "model.layers.1.mlp.shared_expert.up_proj.weight",
        "language_model.model.layers.0.self_attn.o_proj.weight",  # a LLaVA's language model
        "model.language_model.layers.0.mlp.up_proj.weight",  # transformers 5's
    ],
)
def test_projections(name: str) -> None:
    assert is_projection(name)


@pytest.mark.parametrize(
    "name",
    [
        "model.layers.1.block_sparse_moe.gate.weight",  # routers
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.shared_expert_gate.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.embed_tokens.weight",
        "lm_head.weight",
        "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight",  # towers stay unquantized
        "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight",
        "visual.blocks.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.experts.0.w9.weight",
    ],
)
def test_not_projections(name: str) -> None:
    assert not is_projection(name)
