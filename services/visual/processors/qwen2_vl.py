"""Qwen2-VL's and Qwen2.5-VL's image processor (preprocessor_config.json's Qwen2VLImageProcessor):
an image -> its pixel patches and grid, and the number of image tokens a prompt gives it.
NumPy and Pillow only (no torch), so the front end can run it.

    proc = QwenImageProcessor.from_dir(model_dir)
    patches, grid = proc.preprocess(image)         # [t * h * w, C * T * P * P] float32, (t, h, w)
    n = proc.num_tokens(image.height, image.width)  # t * h * w / merge^2 image tokens

The image, made RGB (transparency laid on white), is resized with Pillow's bicubic filter to the
nearest multiples of patch * merge pixels (28) whose area lies within [min_pixels, max_pixels]
(smart_resize), scaled to [0, 1], normalised by the CLIP mean and deviation, and cut into
patches: merge x merge blocks of patches, row-major, each block's patches row-major, each patch
its channels x temporal_patch_size frames (the image repeated) x rows x columns. The grid (t, h,
w) counts patches; the vision tower (services/visual/models/qwen2_vl_vision.py) takes the
patches and grids of any number of images at once.

A chat template puts one <|image_pad|> between <|vision_start|> and <|vision_end|> for each image;
the front end expands it to num_tokens positions (what Hugging Face's processor does to the text;
services/tokenizer/images/families.py), and the worker's M-RoPE positions
(services/worker/mrope_index.py) take the grid with h and w divided by merge_size. The front end
runs this module too: it needs no torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_ASPECT = 200  # the processor refuses images more elongated than this


@dataclass(frozen=True)
class QwenImageProcessor:
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD
    rescale: float = 1 / 255

    def __post_init__(self) -> None:
        if not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(f"min_pixels {self.min_pixels} and max_pixels {self.max_pixels} out of order")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> QwenImageProcessor:
        """preprocessor_config.json's fields: min_pixels and max_pixels, or transformers 5's size
        {shortest_edge, longest_edge}."""
        size = raw.get("size") or {}
        return cls(
            min_pixels=int(raw.get("min_pixels") or size.get("shortest_edge") or cls.min_pixels),
            max_pixels=int(raw.get("max_pixels") or size.get("longest_edge") or cls.max_pixels),
            patch_size=int(raw.get("patch_size", 14)),
            temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
            merge_size=int(raw.get("merge_size", 2)),
            mean=tuple(float(m) for m in raw.get("image_mean", CLIP_MEAN)),
            std=tuple(float(s) for s in raw.get("image_std", CLIP_STD)),
            rescale=float(raw.get("rescale_factor", 1 / 255)),
        )

    @classmethod
    def from_dir(cls, model_dir: str) -> QwenImageProcessor:
        with open(os.path.join(model_dir, "preprocessor_config.json")) as f:
            return cls.from_dict(json.load(f))

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """smart_resize: the size (height, width) the image is resized to."""
        if max(height, width) > MAX_ASPECT * min(height, width):
            raise ValueError(f"image of {width}x{height} is more than {MAX_ASPECT} times longer than wide")
        f = self.patch_size * self.merge_size
        h, w = round(height / f) * f, round(width / f) * f
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h = max(f, math.floor(height / beta / f) * f)
            w = max(f, math.floor(width / beta / f) * f)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * beta / f) * f
            w = math.ceil(width * beta / f) * f
        return h, w

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, h, w) in patches of an image of this size."""
        h, w = self.target_size(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def num_tokens(self, height: int, width: int) -> int:
        """The image pad tokens an image of this size takes in the prompt."""
        t, h, w = self.grid(height, width)
        return t * h * w // self.merge_size**2

    def preprocess(self, image: Image.Image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """-> (patches [t * h * w, C * T * P * P] float32, grid (t, h, w))."""
        h, w = self.target_size(image.height, image.width)
        pixels = np.asarray(rgb(image).resize((w, h), resample=Image.Resampling.BICUBIC))  # [h, w, 3] uint8
        x = (pixels.astype(np.float64) * self.rescale).astype(np.float32)
        x = (x - np.array(self.mean, dtype=np.float32)) / np.array(self.std, dtype=np.float32)
        return self._patchify(x.transpose(2, 0, 1)), self.grid(image.height, image.width)

    def _patchify(self, x: np.ndarray) -> np.ndarray:
        """[C, H, W] -> [patches, C * T * P * P] in the processor's order."""
        c, height, width = x.shape
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        gh, gw = height // p, width // p
        blocks = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(
            1, 4, 2, 5, 0, 3, 6
        )  # [gh/m, gw/m, m, m, C, P, P]
        frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], t, p, p))
        return np.ascontiguousarray(frames).reshape(gh * gw, c * t * p * p)


def rgb(image: Image.Image) -> Image.Image:
    """The image in RGB, any transparency laid on white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")
