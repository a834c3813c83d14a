"""The vision half of make_tiny_model.py's LLaVA directories: a tiny CLIP vision tower and
projector with random weights, the config.json that nests the language model under text_config,
and the image processor's files, in llava-hf's checkpoint layout (what the Hub's LLaVA
checkpoints hold), which Hugging Face's LlavaForConditionalGeneration and AutoProcessor load."""

from __future__ import annotations

import argparse

import torch

IMAGE_TOKEN = "<image>"
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# content parts rendered in order: an image part becomes its placeholder, as llava-hf's templates do
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + IMAGE_TOKEN + "{% "
    "elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vision_config(args: argparse.Namespace) -> dict:
    return {
        "model_type": "clip_vision_model",
        "hidden_size": args.vision_hidden,
        "intermediate_size": _vision_intermediate(args),
        "num_hidden_layers": args.vision_layers,
        "num_attention_heads": args.vision_heads,
        "image_size": args.image_size,
        "patch_size": args.patch_size,
        "num_channels": 3,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
        "projection_dim": args.vision_hidden,
    }


def llava_config(args: argparse.Namespace, text: dict, image_token_id: int) -> dict:
    """config.json: text's config nested, with the vision tower's and the projector's fields."""
    text = {k: v for k, v in text.items() if k != "architectures"}
    next_ = args.arch == "llava_next"
    cfg = {
        "architectures": ["LlavaNextForConditionalGeneration" if next_ else "LlavaForConditionalGeneration"],
        "model_type": "llava_next" if next_ else "llava",
        "text_config": text,
        "vision_config": vision_config(args),
        "image_token_index": image_token_id,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "image_seq_length": (args.image_size // args.patch_size) ** 2,
        "tie_word_embeddings": False,
        "torch_dtype": args.dtype,
    }
    if next_:
        s = args.image_size
        cfg["image_grid_pinpoints"] = [[s, 2 * s], [2 * s, s], [2 * s, 2 * s], [s, 3 * s], [3 * s, s]]
    return cfg


def processor_files(args: argparse.Namespace) -> dict[str, dict]:
    """preprocessor_config.json (CLIP's resize, crop and normalisation) and processor_config.json."""
    s = args.image_size
    pre = {
        "image_processor_type": "LlavaNextImageProcessor" if args.arch == "llava_next" else "CLIPImageProcessor",
        "do_resize": True,
        "size": {"shortest_edge": s},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": s, "width": s},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "do_convert_rgb": True,
    }
    proc = {
        "processor_class": "LlavaNextProcessor" if args.arch == "llava_next" else "LlavaProcessor",
        "patch_size": args.patch_size,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "image_token": IMAGE_TOKEN,
    }
    if args.arch == "llava_next":
        pre["do_pad"] = True
        pre["image_grid_pinpoints"] = llava_config(args, {}, 0)["image_grid_pinpoints"]
    return {"preprocessor_config.json": pre, "processor_config.json": proc}


def vision_weights(args: argparse.Namespace, text_hidden: int) -> dict[str, torch.Tensor]:
    """The tower's and the projector's tensors by llava-hf's names, drawn from a seed of their own."""
    g = torch.Generator().manual_seed(args.seed + 1)
    h, inter = args.vision_hidden, _vision_intermediate(args)
    patches = (args.image_size // args.patch_size) ** 2

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    def linear(p: str, out_f: int, in_f: int) -> dict[str, torch.Tensor]:
        return {p + ".weight": normal(out_f, in_f, std=in_f**-0.5), p + ".bias": normal(out_f, std=0.1)}

    def norm(p: str) -> dict[str, torch.Tensor]:
        return {p + ".weight": 1.0 + normal(h, std=0.1), p + ".bias": normal(h, std=0.1)}

    v = "vision_tower.vision_model."
    w = {
        v + "embeddings.class_embedding": normal(h, std=1.0),
        v + "embeddings.patch_embedding.weight": normal(h, 3, args.patch_size, args.patch_size, std=0.1),
        v + "embeddings.position_embedding.weight": normal(patches + 1, h, std=0.5),
        **norm(v + "pre_layrnorm"),
        **norm(v + "post_layernorm"),
    }
    for i in range(args.vision_layers):
        p = f"{v}encoder.layers.{i}."
        for n in ("q", "k", "v"):
            w |= linear(p + f"self_attn.{n}_proj", h, h)
        w |= linear(p + "self_attn.out_proj", h, h)
        w |= norm(p + "layer_norm1") | norm(p + "layer_norm2")
        w |= linear(p + "mlp.fc1", inter, h) | linear(p + "mlp.fc2", h, inter)
    w |= linear("multi_modal_projector.linear_1", text_hidden, h)
    w |= linear("multi_modal_projector.linear_2", text_hidden, text_hidden)
    if args.arch == "llava_next":
        w["image_newline"] = normal(text_hidden, std=1.0)
    return w


def llava_layout(text: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The language model's tensors under llava-hf's prefixes."""
    return {("language_model." + k): t for k, t in text.items()}


def _vision_intermediate(args: argparse.Namespace) -> int:
    return args.vision_intermediate or 2 * args.vision_hidden


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--image-size", type=int, default=32, help="llava: the tower's square input side")
    ap.add_argument("--patch-size", type=int, default=8, help="llava: the tower's patch side")
    ap.add_argument("--vision-hidden", type=int, default=32, help="llava: the tower's width")
    ap.add_argument("--vision-layers", type=int, default=3, help="llava: the tower's layers")
    ap.add_argument("--vision-heads", type=int, default=2, help="llava: the tower's attention heads")
    ap.add_argument(
        "--vision-intermediate", type=int, default=0, help="llava: the tower's MLP width; 0: twice its width"
    )
