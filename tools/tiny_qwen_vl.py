"""The vision half of a tiny Qwen2-VL or Qwen2.5-VL directory (tools/make_tiny_model.py --arch
qwen2_vl|qwen2_5_vl): the vision tower's config and random weights under the names Qwen's released
checkpoints use (``visual.*``), the special tokens, the chat template with image placeholders and
the processor's files, so Hugging Face's AutoProcessor and ForConditionalGeneration load it.

The tower keeps the real patch geometry (14-pixel patches, 2 frames a temporal patch, 2x2 merge),
so pixel_values have their real width (3 * 2 * 14 * 14); only its width and depth are tiny.
Qwen2.5-VL's window (56 pixels: 2x2 merged patches) is small enough that test images span several
windows, and two of its four blocks attend fully (fullatt_block_indexes).

transformers 5's AutoProcessor for these models also loads a video processor, which needs
torchvision; without it, AutoImageProcessor and AutoTokenizer load the directory's parts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

VL_ARCHS = ("qwen2_vl", "qwen2_5_vl")
ARCHITECTURES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}
# in id order after Qwen's text specials, as Qwen2-VL's tokenizer has them
SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

Draw = Callable[..., torch.Tensor]


def vision_config(arch: str, out_hidden: int) -> dict:
    """config.json's vision_config: Qwen2-VL's (LayerNorm, quick GELU MLP, full attention) or
    Qwen2.5-VL's (RMSNorm, SwiGLU, windows but in fullatt_block_indexes)."""
    common = {"patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_chans": 3, "num_heads": 2}
    if arch == "qwen2_vl":
        return common | {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": out_hidden,
            "mlp_ratio": 2,
            "hidden_act": "quick_gelu",
        }
    return common | {
        "depth": 4,
        "hidden_size": 32,
        "intermediate_size": 48,
        "out_hidden_size": out_hidden,
        "hidden_act": "silu",
        "window_size": 56,
        "fullatt_block_indexes": [1, 3],
        "tokens_per_second": 2,
    }


def vision_weights(args: argparse.Namespace, normal: Draw) -> dict[str, torch.Tensor]:
    """The tower's tensors by Qwen's checkpoint names (visual.*)."""
    cfg = vision_config(args.arch, args.hidden)
    qwen25 = args.arch == "qwen2_5_vl"
    width = cfg["hidden_size"] if qwen25 else cfg["embed_dim"]
    out = cfg["out_hidden_size"] if qwen25 else cfg["hidden_size"]
    inner = cfg["intermediate_size"] if qwen25 else width * cfg["mlp_ratio"]
    merged = width * cfg["spatial_merge_size"] ** 2
    patch_in = cfg["in_chans"] * cfg["temporal_patch_size"] * cfg["patch_size"] ** 2

    def linear(name: str, out_f: int, in_f: int) -> dict[str, torch.Tensor]:
        return {name + ".weight": normal(out_f, in_f, std=in_f**-0.5), name + ".bias": normal(out_f, std=0.1)}

    def norm(name: str, n: int) -> dict[str, torch.Tensor]:
        w = {name + ".weight": 1.0 + normal(n, std=0.1)}
        return w if qwen25 else w | {name + ".bias": normal(n, std=0.1)}

    patch = normal(width, patch_in, std=patch_in**-0.5)
    w = {"visual.patch_embed.proj.weight": patch.view(width, cfg["in_chans"], cfg["temporal_patch_size"], 14, 14)}
    for i in range(cfg["depth"]):
        p = f"visual.blocks.{i}."
        w |= norm(p + "norm1", width) | norm(p + "norm2", width)
        w |= linear(p + "attn.qkv", 3 * width, width) | linear(p + "attn.proj", width, width)
        if qwen25:
            w |= linear(p + "mlp.gate_proj", inner, width) | linear(p + "mlp.up_proj", inner, width)
            w |= linear(p + "mlp.down_proj", width, inner)
        else:
            w |= linear(p + "mlp.fc1", inner, width) | linear(p + "mlp.fc2", width, inner)
    w |= norm("visual.merger.ln_q", width)
    w |= linear("visual.merger.mlp.0", merged, merged) | linear("visual.merger.mlp.2", out, merged)
    return w


def model_fields(arch: str, args: argparse.Namespace, token_ids: dict[str, int]) -> dict:
    """What config.json adds for a vision-language model, in the layout Qwen's released configs
    have (the text model's fields at the top level): the vision config, M-RoPE's sections (the
    rotary frequencies given to the t, h and w positions; they sum to head_dim / 2) and the
    special tokens' ids."""
    half = args.hidden // args.heads // 2
    section = [half // 4, (half - half // 4) // 2]
    section.append(half - sum(section))
    return {
        "model_type": arch,
        "vision_config": vision_config(arch, args.hidden),
        "rope_scaling": {"type": "mrope", "mrope_section": section},
        "vision_start_token_id": token_ids["<|vision_start|>"],
        "vision_end_token_id": token_ids["<|vision_end|>"],
        "vision_token_id": token_ids["<|vision_pad|>"],
        "image_token_id": token_ids["<|image_pad|>"],
        "video_token_id": token_ids["<|video_pad|>"],
    }


def add_files(files: dict[str, dict], args: argparse.Namespace, token_ids: dict[str, int]) -> None:
    """The model directory's files (name -> JSON content) made a vision-language model's."""
    files["config.json"] |= model_fields(args.arch, args, token_ids)
    files |= processor_files(args.arch)
    files["tokenizer_config.json"]["chat_template"] = CHAT_TEMPLATE


def processor_files(arch: str) -> dict[str, dict]:
    """The image processor's config (Qwen2VLImageProcessor for both families; small max_pixels so
    tests stay fast) and the processor's chat template."""
    processor = "Qwen2VLProcessor" if arch == "qwen2_vl" else "Qwen2_5_VLProcessor"
    image = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor,
        "do_resize": True,
        "resample": 3,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "do_convert_rgb": True,
        "min_pixels": 56 * 56,
        "max_pixels": 28 * 28 * 64,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    return {"preprocessor_config.json": image, "chat_template.json": {"chat_template": CHAT_TEMPLATE}}
