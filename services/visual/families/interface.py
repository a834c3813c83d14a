"""What the visual service asks of a vision family: an image prepared as the model's processor
prepares it, and a batch of prepared images encoded into the rows that fill their prompt
positions. The count of rows must be what the front end's count for the family says
(services/tokenizer/images/families.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from PIL import Image


@dataclass
class Pixels:
    """One image, ready for the tower."""

    # float32 on the CPU, what the tower encodes: LLaVA's squares [tiles, 3, S, S]; Qwen2-VL's
    # patches [t * h * w, C * T * P * P]
    values: torch.Tensor
    size: tuple[int, int]  # the image's (height, width) as sent: what the family's layout depends on


class VisionTower(Protocol):
    hidden_size: int  # the language model's: each embedding row's width
    dtype: torch.dtype

    def prepare(self, image: Image.Image) -> Pixels:
        """Resize, crop or tile, and normalise, as the model's image processor does."""
        ...

    def encode(self, images: list[Pixels]) -> list[torch.Tensor]:
        """Every image's embeddings, [n_tokens, hidden_size] each, in one batch through the tower."""
        ...
