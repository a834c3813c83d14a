"""The Qwen2-VL and Qwen2.5-VL vision towers (services/visual/models/qwen2_vl_vision.py) against
Hugging Face's: the tower's output for a batch of images of different sizes, two of one size
(their frames attend as one SDPA batch; Qwen2.5-VL's split into several windows each, some cut at
the edges), each image alone equal to its rows of the batch, and both checkpoint layouts."""

from __future__ import annotations

import json
import os

import pytest
import torch

from services.visual.models.qwen2_vl_config import QwenVisionConfig
from services.visual.models.qwen2_vl_layout import windows
from services.visual.models.qwen2_vl_vision import load_tower
from shared.vision_config import VisionConfig
from tests import qwen_vl_reference as ref

ARCHS = ("qwen2_vl", "qwen2_5_vl")
SIZES = ((84, 56), (70, 130), (200, 150), (84, 56))  # width, height: 4x6, 10x6, 10x14, 4x6 patches


def _config(model_dir: str) -> QwenVisionConfig:
    with open(os.path.join(model_dir, "config.json")) as f:
        return QwenVisionConfig.of(VisionConfig.from_dict(json.load(f), {}))


def _pixels(model_dir: str) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    images = [ref.image(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    out = ref.image_processor(model_dir)(images=images, return_tensors="pt")
    return out["pixel_values"], [tuple(g) for g in out["image_grid_thw"].tolist()]


@pytest.mark.parametrize("arch", ARCHS)
def test_tower_matches_hf(tiny_vl_models: dict[str, str], arch: str) -> None:
    model_dir = tiny_vl_models[arch]
    cfg = _config(model_dir)
    assert cfg.family == arch and cfg.rms_norm == (arch == "qwen2_5_vl")
    pixels, grids = _pixels(model_dir)
    tower = load_tower(model_dir, cfg, torch.float32, "cpu")
    got = tower.encode(pixels, grids)
    with torch.no_grad():
        want = ref.model(model_dir).model.visual(pixels, grid_thw=torch.tensor(grids)).pooler_output
    assert got.shape == (sum(tower.token_counts(grids)), 64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # each image encoded alone: its rows of the batch
    start = 0
    for k, n in enumerate(tower.token_counts(grids)):
        rows = pixels[sum(t * h * w for t, h, w in grids[:k]) :][: n * 4]
        torch.testing.assert_close(tower.encode(rows, grids[k : k + 1]), got[start : start + n], rtol=1e-5, atol=1e-5)
        start += n


def test_qwen25_images_span_several_windows(tiny_vl_models: dict[str, str]) -> None:
    cfg = _config(tiny_vl_models["qwen2_5_vl"])
    _, grids = _pixels(tiny_vl_models["qwen2_5_vl"])
    order, cu = windows(grids, cfg.merge_size, cfg.window_blocks)
    assert len(cu) - 1 > 2 * len(grids)  # more windows than images, several per image
    assert not torch.equal(order, torch.arange(len(order)))  # attention order differs from the prompt's
    assert set(torch.diff(cu).tolist()) == {4, 8, 16}  # whole 2x2-block windows and cut ones at the edges
    assert cfg.full_blocks == (1, 3)


def test_config_of_transformers_5_layout(tiny_vl_models: dict[str, str], tmp_path) -> None:
    """save_pretrained's config.json (text fields under text_config, rope_parameters in the vision
    config) gives the same tower config as Qwen's released layout."""
    model_dir = tiny_vl_models["qwen2_5_vl"]
    ref.model(model_dir).save_pretrained(tmp_path)
    assert _config(str(tmp_path)) == _config(model_dir)
    pixels, grids = _pixels(model_dir)
    a = load_tower(str(tmp_path), _config(str(tmp_path)), torch.float32, "cpu").encode(pixels, grids)
    torch.testing.assert_close(a, load_tower(model_dir, _config(model_dir), torch.float32, "cpu").encode(pixels, grids))


def test_transformers_4_tower_names_load_the_same(tiny_vl_models: dict[str, str], tmp_path) -> None:
    """transformers 4.5x saved the tower under model.visual.: the same tensors load the same tower."""
    from safetensors.torch import load_file, save_file

    model_dir = tiny_vl_models["qwen2_vl"]
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    renamed = {("model." + k if k.startswith("visual.") else k): t for k, t in weights.items()}
    assert "model.visual.merger.mlp.0.weight" in renamed
    save_file(renamed, os.path.join(tmp_path, "model.safetensors"))
    pixels, grids = _pixels(model_dir)
    cfg = _config(model_dir)
    a = load_tower(str(tmp_path), cfg, torch.float32, "cpu").encode(pixels, grids)
    torch.testing.assert_close(a, load_tower(model_dir, cfg, torch.float32, "cpu").encode(pixels, grids))
