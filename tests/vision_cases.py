"""Images and Hugging Face references for the vision tests: images drawn from a seed, and what
LlavaForConditionalGeneration generates greedily for a prompt with them."""

from __future__ import annotations

import functools
import hashlib
import io

import numpy as np
import torch
from PIL import Image


def image(seed: int, width: int, height: int) -> Image.Image:
    """A smooth random picture (blocks of colour, so resizing keeps some of it)."""
    rng = np.random.RandomState(seed)
    small = rng.randint(0, 255, (max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((width, height), Image.Resampling.NEAREST)


def png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=4)
def hf_model(model_dir: str):
    from transformers import AutoConfig, AutoProcessor, LlavaForConditionalGeneration, LlavaNextForConditionalGeneration

    arch = AutoConfig.from_pretrained(model_dir).architectures[0]
    cls = LlavaNextForConditionalGeneration if arch.startswith("LlavaNext") else LlavaForConditionalGeneration
    return AutoProcessor.from_pretrained(model_dir), cls.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_inputs(model_dir: str, text: str, images: list[Image.Image], add_special_tokens: bool) -> dict:
    processor, _ = hf_model(model_dir)
    return processor(text=text, images=images or None, return_tensors="pt", add_special_tokens=add_special_tokens)


def hf_greedy(
    model_dir: str, text: str, images: list[Image.Image], max_new: int, add_special_tokens: bool
) -> list[int]:
    """Hugging Face's greedy continuation of text (with <image> placeholders) and images."""
    _, model = hf_model(model_dir)
    x = hf_inputs(model_dir, text, images, add_special_tokens)
    with torch.no_grad():
        out = model.generate(**x, max_new_tokens=max_new, do_sample=False)
    new = out[0, x["input_ids"].shape[1] :].tolist()
    eos = set(model.generation_config.eos_token_id or [])
    for i, t in enumerate(new):
        if t in eos:
            return new[: i + 1]
    return new
