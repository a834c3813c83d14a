"""Gemma 2 and 3 config.json parsing (shared/model_config.py): Hugging Face's defaults, each
layer's window, the soft caps, the rotary bases in both spellings, and what is refused."""

from __future__ import annotations

import pytest

from shared.model_config import ModelConfig, ModelConfigError

GEMMA2_2B = {  # google/gemma-2-2b's config.json, the fields read here
    "architectures": ["Gemma2ForCausalLM"],
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 256000,
}
GEMMA3_1B = {  # google/gemma-3-1b-it's
    "architectures": ["Gemma3ForCausalLM"],
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "vocab_size": 262144,
}


def test_gemma2_even_layers_slide_and_both_caps_apply() -> None:
    cfg = ModelConfig.from_dict(GEMMA2_2B)
    assert cfg.family == "gemma2" and cfg.tie_word_embeddings and cfg.head_dim == 256
    assert cfg.layer_windows == (4096, 0) * 13
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap) == (50.0, 30.0)
    assert cfg.attention_scale == 256**-0.5 and cfg.local_rope_theta == 0.0
    assert cfg.max_position_embeddings == 8192  # not cut to the window: the global layers see everything


def test_gemma2_defaults_are_hugging_faces() -> None:
    bare = {k: v for k, v in GEMMA2_2B.items() if k not in ("attn_logit_softcapping", "final_logit_softcapping")}
    bare = {k: v for k, v in bare.items() if k not in ("head_dim", "query_pre_attn_scalar", "sliding_window")}
    cfg = ModelConfig.from_dict(bare)
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap, cfg.head_dim) == (50.0, 30.0, 256)
    assert cfg.query_pre_attn_scalar == 256 and cfg.layer_windows[0] == 4096
    off = ModelConfig.from_dict({**GEMMA2_2B, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (off.attn_logit_softcap, off.final_logit_softcap) == (0.0, 0.0)


def test_gemma3_five_layers_of_six_slide_with_their_own_rotary_base() -> None:
    cfg = ModelConfig.from_dict(GEMMA3_1B)
    assert cfg.family == "gemma3" and cfg.layer_windows == ((512,) * 5 + (0,)) * 4 + (512, 512)
    assert (cfg.rope_theta, cfg.local_rope_theta, cfg.rope_scaling) == (1e6, 1e4, {})
    assert (cfg.attn_logit_softcap, cfg.final_logit_softcap) == (0.0, 0.0)
    assert cfg.max_position_embeddings == 32768
    # Hugging Face's Gemma 3 attention applies no soft cap whatever config.json says
    assert ModelConfig.from_dict({**GEMMA3_1B, "attn_logit_softcapping": 50.0}).attn_logit_softcap == 0.0
    assert ModelConfig.from_dict({**GEMMA3_1B, "final_logit_softcapping": 30.0}).final_logit_softcap == 30.0


def test_gemma3_by_model_type_and_layer_types() -> None:
    raw = {k: v for k, v in GEMMA3_1B.items() if k != "architectures"}
    types = ["full_attention", "sliding_attention"] * 13
    cfg = ModelConfig.from_dict({**raw, "layer_types": types})
    assert cfg.family == "gemma3" and cfg.layer_windows == (0, 512) * 13


def test_gemma3_rotary_in_transformers_5s_spelling() -> None:
    """rope_parameters per layer type, as transformers 5 writes a Gemma 3 config (4B and up:
    linear scaling on the global layers)."""
    raw = {k: v for k, v in GEMMA3_1B.items() if k not in ("rope_theta", "rope_scaling", "rope_local_base_freq")}
    raw["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
    cfg = ModelConfig.from_dict(raw)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    classic = ModelConfig.from_dict({**GEMMA3_1B, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert classic.rope_scaling == cfg.rope_scaling


def test_the_benchmark_shapes_parse() -> None:
    from services.worker.models.bench_shapes import SHAPES

    g2, g3 = ModelConfig.from_dict(SHAPES["gemma2-9b"]), ModelConfig.from_dict(SHAPES["gemma3-12b"])
    assert g2.family == "gemma2" and g2.layer_windows[:2] == (4096, 0) and g2.num_layers == 42
    assert g3.family == "gemma3" and g3.layer_windows[:6] == (1024,) * 5 + (0,) and g3.rope_scaling["factor"] == 8.0


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({**GEMMA2_2B, "hidden_activation": "gelu"}, "hidden_activation 'gelu' is not supported"),
        ({**GEMMA3_1B, "use_bidirectional_attention": True}, "bidirectional"),
        ({**GEMMA3_1B, "layer_types": ["sliding_attention", "chunked_attention"] * 13}, "chunked_attention"),
        ({**GEMMA3_1B, "layer_types": ["full_attention"] * 3}, "each of 26 layers"),
        ({**GEMMA2_2B, "sliding_window": None}, "need a sliding_window"),
        (
            {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": GEMMA3_1B},
            "multimodal Gemma 3",
        ),
    ],
)
def test_what_is_not_served_is_refused_in_one_line(raw: dict, match: str) -> None:
    with pytest.raises(ModelConfigError, match=match) as e:
        ModelConfig.from_dict(raw)
    assert "\n" not in str(e.value)
