"""Qwen2-VL's image processor (services/visual/processors/qwen2_vl.py) against Hugging Face's
Qwen2VLImageProcessor: pixel_values and image_grid_thw for images of several sizes and modes
(small ones scaled up to min_pixels, large ones down to max_pixels, elongated, transparent,
greyscale). The prompt's expansion is the front end's (tests/tokenizer/images/test_front.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from services.visual.processors.qwen2_vl import QwenImageProcessor
from tests import qwen_vl_reference as ref

# (width, height): within bounds, rounding both ways, under min_pixels, over max_pixels, elongated
SIZES = [(84, 56), (70, 130), (41, 29), (20, 20), (640, 480), (1000, 90), (57, 300)]


def _images() -> list[Image.Image]:
    out = [ref.image(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    rgba = ref.image(90, 60, seed=9).convert("RGBA")
    rgba.putalpha(Image.fromarray(np.arange(90 * 60, dtype=np.uint8).reshape(60, 90)))
    return [*out, rgba, ref.image(60, 90, seed=10).convert("L")]


@pytest.fixture(scope="module")
def model_dir(tiny_vl_models: dict[str, str]) -> str:
    return tiny_vl_models["qwen2_5_vl"]


def test_patches_and_grids_match_hf(model_dir: str) -> None:
    proc = QwenImageProcessor.from_dir(model_dir)
    hf = ref.image_processor(model_dir)
    for img in _images():
        want = hf(images=[img], return_tensors="pt")
        patches, grid = proc.preprocess(img)
        assert grid == tuple(want["image_grid_thw"][0].tolist()), img.size
        torch.testing.assert_close(torch.from_numpy(patches), want["pixel_values"], rtol=0, atol=1e-6)
        n = proc.num_tokens(img.height, img.width)
        assert n * 4 == hf.get_number_of_image_patches(img.height, img.width) == patches.shape[0]


def test_sizes_reach_every_branch_of_the_resize(model_dir: str) -> None:
    proc = QwenImageProcessor.from_dir(model_dir)
    h, w = proc.target_size(480, 640)  # rounded: 476 x 644, over max_pixels: scaled down
    assert h * w <= proc.max_pixels < 476 * 644
    assert proc.target_size(20, 20) == (56, 56)  # rounded to nothing: scaled up to min_pixels
    assert proc.target_size(56, 84) == (56, 84)  # within bounds: rounded only
    areas = [proc.target_size(h, w) for w, h in SIZES]
    assert all(h % 28 == 0 and w % 28 == 0 and proc.min_pixels <= h * w <= proc.max_pixels for h, w in areas)
    with pytest.raises(ValueError, match="longer than wide"):
        proc.target_size(1, 201)
