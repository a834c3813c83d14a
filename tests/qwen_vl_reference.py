"""Hugging Face's Qwen2-VL and Qwen2.5-VL as the reference: the whole model (vision tower and
language model), its image processor and tokenizer, and prompts with images laid out as its
processor lays them (each image's one <|image_pad|> repeated grid_t * grid_h * grid_w / 4 times).

Hugging Face's Qwen2VLProcessor itself needs torchvision (for its video processor), which the
test environment lacks; its expansion is the one written here, which test_qwen2_vl_processor.py
checks against the image processor's own patch count."""

from __future__ import annotations

import functools
import json
import os

import torch
from PIL import Image


@functools.cache
def model(model_dir: str):
    import transformers

    transformers.logging.set_verbosity_error()
    with open(os.path.join(model_dir, "config.json")) as f:
        kind = json.load(f)["model_type"]
    cls = transformers.Qwen2VLForConditionalGeneration
    if kind == "qwen2_5_vl":
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    return cls.from_pretrained(model_dir, dtype=torch.float32).eval()


@functools.cache
def image_processor(model_dir: str):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(model_dir)


@functools.cache
def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def image(width: int, height: int, seed: int) -> Image.Image:
    """A random RGB image."""
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def prompt(model_dir: str, text: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """A user turn with the images, then text, through the chat template -> input_ids [1, L],
    pixel_values, image_grid_thw and mm_token_type_ids as Hugging Face's processor gives them."""
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    chat = tokenizer(model_dir).apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return inputs(model_dir, chat, images)


def inputs(model_dir: str, text: str, images: list[Image.Image]) -> dict[str, torch.Tensor]:
    """text with one <|image_pad|> per image -> what Hugging Face's processor gives: each
    <|image_pad|> repeated grid_t * grid_h * grid_w / 4 times, then tokenized."""
    tok = tokenizer(model_dir)
    pieces = text.split("<|image_pad|>")
    if not images:
        return {"input_ids": tok(text, return_tensors="pt")["input_ids"]}
    pixels = image_processor(model_dir)(images=images, return_tensors="pt")
    counts = (pixels["image_grid_thw"].prod(-1) // 4).tolist()
    expanded = pieces[0] + "".join("<|image_pad|>" * n + rest for n, rest in zip(counts, pieces[1:], strict=True))
    ids = tok(expanded, return_tensors="pt")["input_ids"]
    image_id = model(model_dir).config.image_token_id
    return {
        "input_ids": ids,
        "pixel_values": pixels["pixel_values"],
        "image_grid_thw": pixels["image_grid_thw"],
        "mm_token_type_ids": (ids == image_id).int(),
    }


def greedy_text(model_dir: str, x: dict[str, torch.Tensor], max_new: int) -> str:
    """Hugging Face's greedy continuation of inputs x, to the first end-of-sequence id (kept, as
    LightStream keeps it), decoded without special tokens."""
    m = model(model_dir)
    with torch.no_grad():
        out = m.generate(**x, max_new_tokens=max_new, do_sample=False)
    new = out[0, x["input_ids"].shape[1] :].tolist()
    eos = m.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    end = next((i + 1 for i, t in enumerate(new) if t in eos), len(new))
    return tokenizer(model_dir).decode(new[:end], skip_special_tokens=True)
