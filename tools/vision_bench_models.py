"""Real-shape vision-language model directories for tools/bench_vision.py: config.json with the
released text and vision configs, the processor files the front end and the visual service read,
and make_bench_model's synthetic tokenizer of the full vocabulary with the family's image tokens
as special tokens at the ids config.json names. No weights: the worker and the visual service
draw them (--random-weights true).

    python tools/vision_bench_models.py --out DIR --shape llava-1.5-7b|qwen2.5-vl-7b

llava-1.5-7b is llava-hf/llava-1.5-7b-hf's config.json (CLIP ViT-L/14 at 336 pixels read at its
second-to-last layer, a two-layer GELU projector, Vicuna-7B: Llama-2-7B's shape), its text_config
written out in full; qwen2.5-vl-7b is Qwen/Qwen2.5-VL-7B-Instruct's (the text fields at the top
level, as Qwen's released configs have them; tests/shared/test_model_config_qwen_vl.py parses
the same values) with its preprocessor_config.json's pixel bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import make_bench_model, tiny_qwen_vl, tiny_vision

LLAVA_15_7B = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "image_token_index": 32000,
    "pad_token_id": 32001,
    "projector_hidden_act": "gelu",
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "image_seq_length": 576,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 32064,
    "text_config": {
        "model_type": "llama",
        "vocab_size": 32064,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
    },
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "image_size": 336,
        "patch_size": 14,
        "num_channels": 3,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": 768,
    },
}
QWEN25_VL_7B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "max_window_layers": 28,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "sliding_window": 32768,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_config": {
        "depth": 32,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [7, 15, 23, 31],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
}
QWEN_FIRST_SPECIAL = 151643  # Qwen2's regular tokens end here; its special ones follow
QWEN_PIXELS = {"min_pixels": 3136, "max_pixels": 12845056}  # Qwen2.5-VL-7B's preprocessor_config.json
SHAPES = ("llava-1.5-7b", "qwen2.5-vl-7b")


def llava_files() -> tuple[dict[str, dict], dict[int, str], int]:
    """-> (files but the tokenizer's, named special ids, how many special ids)."""
    cfg = json.loads(json.dumps(LLAVA_15_7B))
    vision = argparse.Namespace(arch="llava", image_size=336, patch_size=14)
    files = {"config.json": cfg, **tiny_vision.processor_files(vision)}
    named = {cfg["image_token_index"]: tiny_vision.IMAGE_TOKEN, cfg["pad_token_id"]: "<pad>"}
    return files, named, make_bench_model.NUM_SPECIAL


def qwen_files() -> tuple[dict[str, dict], dict[int, str], int]:
    cfg = json.loads(json.dumps(QWEN25_VL_7B))
    files = {"config.json": cfg, **tiny_qwen_vl.processor_files("qwen2_5_vl")}
    files["preprocessor_config.json"].update(QWEN_PIXELS)
    start = cfg["vision_start_token_id"]
    named = {start + i: name for i, name in enumerate(tiny_qwen_vl.SPECIALS)}
    assert named[cfg["image_token_id"]] == "<|image_pad|>"
    return files, named, cfg["vocab_size"] - QWEN_FIRST_SPECIAL


def write(out: str, shape: str) -> str:
    """The model directory for shape in out (made if missing); -> out."""
    files, named, num_special = llava_files() if shape == "llava-1.5-7b" else qwen_files()
    cfg = files["config.json"]
    text = cfg.get("text_config", cfg)
    template = tiny_vision.CHAT_TEMPLATE if shape == "llava-1.5-7b" else tiny_qwen_vl.CHAT_TEMPLATE
    tok = make_bench_model.synthetic_tokenizer(text["vocab_size"], num_special=num_special, named=named)
    assert tok.get_vocab_size() == text["vocab_size"], tok.get_vocab_size()
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    for c in {id(cfg): cfg, id(text): text}.values():
        c.update(bos_token_id=bos, eos_token_id=eos)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    files["generation_config.json"] = {"bos_token_id": bos, "eos_token_id": eos}
    files["tokenizer_config.json"] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "model_max_length": text["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": template,
    }
    for name, content in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(content, f, indent=2)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=SHAPES, default="llava-1.5-7b")
    args = ap.parse_args(argv)
    print(write(args.out, args.shape))


if __name__ == "__main__":
    main()
