"""Qwen2-VL and Qwen2.5-VL config.json parsing (shared/model_config.py): the language model's
fields at the top level (Qwen's released configs) or under text_config (transformers 5's
save_pretrained), M-RoPE's sections from rope_scaling or rope_parameters, and what is refused."""

from __future__ import annotations

import pytest

from shared.model_config import ModelConfig, ModelConfigError
from shared.vision_config import VisionConfig, text_config
from tools.vision_bench_models import QWEN25_VL_7B  # Qwen/Qwen2.5-VL-7B-Instruct's config.json

TEXT = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads")


def test_released_layout() -> None:
    cfg = ModelConfig.from_dict(text_config(QWEN25_VL_7B))
    assert cfg.family == "qwen2_5_vl" and cfg.qkv_bias and cfg.head_dim == 128
    assert cfg.mrope_section == (16, 24, 24) and cfg.rope_scaling == {} and cfg.rope_theta == 1e6
    assert cfg.max_position_embeddings == 128000  # no window: not used
    vision = VisionConfig.from_dict(QWEN25_VL_7B, {})
    assert (vision.family, vision.image_token_id, vision.merge_size) == ("qwen2_5_vl", 151655, 2)


def test_transformers_5_layout_reads_the_same() -> None:
    """Text fields under text_config, rope_parameters with mrope_section and both type spellings."""
    raw = {k: v for k, v in QWEN25_VL_7B.items() if k not in (*TEXT, "rope_theta", "rope_scaling")}
    raw["text_config"] = {k: QWEN25_VL_7B[k] for k in TEXT} | {
        "rope_parameters": {"type": "mrope", "rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6}
    }
    assert ModelConfig.from_dict(text_config(raw)) == ModelConfig.from_dict(text_config(QWEN25_VL_7B))


def test_qwen2_vl_is_its_own_family() -> None:
    raw = QWEN25_VL_7B | {"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl"}
    assert ModelConfig.from_dict(text_config(raw)).family == "qwen2_vl"


def test_sections_must_cover_half_the_head() -> None:
    raw = QWEN25_VL_7B | {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 16]}}
    with pytest.raises(ModelConfigError, match="mrope_section"):
        ModelConfig.from_dict(text_config(raw))
