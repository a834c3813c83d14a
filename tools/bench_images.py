"""benchmark_serving's image requests: each of the workload's requests as a chat with synthetic
images (--images-per-request, --image-size; drawn from a seed per request, so no two requests
share an image and the visual service encodes every one) before a text of about the workload's
input length in the served model's tokenizer (--tokenizer; prompt_text)."""

from __future__ import annotations

import argparse
import base64
import io
import json

import numpy as np
from PIL import Image


def synthetic_png(seed: int, size: int) -> bytes:
    """A size x size picture of random 8x8-pixel blocks, as PNG."""
    rng = np.random.RandomState(seed)
    blocks = rng.randint(0, 256, (max(1, size // 8), max(1, size // 8), 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(blocks).resize((size, size), Image.Resampling.NEAREST).save(buf, format="PNG")
    return buf.getvalue()


def prompt_text(tok, ids: list[int]) -> str:
    """A text of len(ids) tokens: random ids decoded re-tokenize into far more (a synthetic
    vocabulary's merges do not re-form: seven times as many at 32k and 152k ids), so the text is
    cut to the first len(ids) tokens of its own re-tokenization, which re-tokenize as themselves."""
    text = tok.decode(ids, skip_special_tokens=True)
    return tok.decode(
        tok(text, add_special_tokens=False, verbose=False)["input_ids"][: len(ids)], skip_special_tokens=True
    )


def chat_bodies(args: argparse.Namespace, model: str, reqs: list[tuple[list[int], int]]) -> list[bytes]:
    """A streamed chat completion body per (prompt ids, output length), images first."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    bodies = []
    for k, (ids, out_len) in enumerate(reqs):
        images = [synthetic_png(args.image_seed + k * args.images_per_request + i, args.image_size)
                  for i in range(args.images_per_request)]  # fmt: skip
        content = [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(p).decode()}}
            for p in images
        ]
        content.append({"type": "text", "text": prompt_text(tok, ids)})
        body = {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": out_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        bodies.append(json.dumps(body).encode())
    return bodies


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--images-per-request",
        type=int,
        default=0,
        help="sharegpt as chats with this many synthetic images each (a vision model; needs --tokenizer); 0: text",
    )
    ap.add_argument("--image-size", type=int, default=448, help="the synthetic images' side in pixels")
    ap.add_argument("--image-seed", type=int, default=0, help="request k's images are drawn from seeds after this")
