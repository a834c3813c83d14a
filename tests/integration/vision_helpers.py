"""What the vision stack tests share: a request's images as each API sends them, Hugging Face's
text for the same prompt and images, and the visual replica's cache counters."""

from __future__ import annotations

import base64
import functools

from PIL import Image
from transformers import AutoTokenizer

from tests import vision_cases as vc
from tests.integration.api_helpers import metric_samples


def b64(img: Image.Image) -> str:
    return base64.b64encode(vc.png(img)).decode()


def data_url(img: Image.Image) -> str:
    return "data:image/png;base64," + b64(img)


def chat_content(text: str, images: list[Image.Image]) -> list[dict]:
    """OpenAI content parts: the images first, then the text."""
    return [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images] + [{"type": "text", "text": text}]


@functools.lru_cache(maxsize=2)
def _tokenizer(model_dir: str):
    return AutoTokenizer.from_pretrained(model_dir)


def hf_chat_text(model_dir: str, text: str, images: list[Image.Image], max_new: int) -> str:
    """Hugging Face's greedy answer to one user message with the images before its text."""
    tok = _tokenizer(model_dir)
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    prompt = tok.apply_chat_template([{"role": "user", "content": parts}], add_generation_prompt=True, tokenize=False)
    ids = vc.hf_greedy(model_dir, prompt, images, max_new, add_special_tokens=False)
    return tok.decode(ids, skip_special_tokens=True)


def hf_generate_text(model_dir: str, prompt: str, images: list[Image.Image], max_new: int) -> str:
    """Hugging Face's greedy continuation of a /generate prompt (its BOS added, as LightStream's)."""
    ids = vc.hf_greedy(model_dir, prompt, images, max_new, add_special_tokens=True)
    return _tokenizer(model_dir).decode(ids, skip_special_tokens=True)


def cache_counts(metrics_url: str) -> tuple[float, float]:
    """The visual replica's (cache hits, cache misses) from its /metrics."""
    samples = metric_samples(metrics_url)
    hits = sum(v for (name, _), v in samples.items() if name == "lightstream_visual_cache_hits_total")
    misses = sum(v for (name, _), v in samples.items() if name == "lightstream_visual_cache_misses_total")
    return hits, misses
