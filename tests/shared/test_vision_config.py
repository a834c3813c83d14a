"""A vision-language config.json read as the services read it: llava-hf's partial text_config
filled with Hugging Face's defaults, the vision fields, and what is refused."""

from __future__ import annotations

import json

import pytest

from shared.model_config import ModelConfig
from shared.vision_config import VisionConfig, VisionConfigError, text_config

# llava-hf/llava-1.5-7b-hf's config.json, as the Hub has it (its text_config gives only what differs)
LLAVA_15_7B = {
    "architectures": ["LlavaForConditionalGeneration"],
    "image_token_index": 32000,
    "model_type": "llava",
    "projector_hidden_act": "gelu",
    "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096, "model_type": "llama",
                    "rms_norm_eps": 1e-05, "torch_dtype": "float16", "vocab_size": 32064},
    "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768},
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
}  # fmt: skip


def test_llava_15_7b_reads_as_llama_7b_with_a_clip_l_tower(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAVA_15_7B))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"crop_size": {"height": 336, "width": 336}}))
    cfg = ModelConfig.from_dir(str(tmp_path))
    assert (cfg.family, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == ("llama", 4096, 32, 32, 32)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.context_length) == (11008, 32064, 4096)
    v = cfg.vision
    assert v is not None and (v.family, v.image_token_id, v.feature_layer) == ("llava", 32000, -2)
    assert v.tokens_per_tile == 576  # (336 / 14)^2, the CLS position dropped


def test_what_is_refused() -> None:
    def parse(**changes) -> VisionConfig:
        return VisionConfig.from_dict({**LLAVA_15_7B, **changes}, {})

    with pytest.raises(VisionConfigError, match="CLIP only"):
        parse(vision_config={"model_type": "siglip_vision_model"})
    with pytest.raises(VisionConfigError, match="only one layer"):
        parse(vision_feature_layer=[-2, -5])
    with pytest.raises(VisionConfigError, match="image_grid_pinpoints"):
        parse(architectures=["LlavaNextForConditionalGeneration"])
    with pytest.raises(VisionConfigError, match="full is not supported"):
        parse(architectures=["LlavaNextForConditionalGeneration"], image_grid_pinpoints=[[336, 672]],
              vision_feature_select_strategy="full")  # fmt: skip
    with pytest.raises(VisionConfigError, match="'qwen2' language model is not supported"):
        text_config({**LLAVA_15_7B, "text_config": {"model_type": "qwen2"}})
    assert parse(vision_feature_select_strategy="full").tokens_per_tile == 577
