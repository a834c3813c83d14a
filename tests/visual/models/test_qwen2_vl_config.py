"""The vision config (services/visual/models/qwen2_vl_config.py) read from Qwen2-VL-7B's and
Qwen2.5-VL-7B's released config.json, and what it refuses."""

from __future__ import annotations

import pytest

from services.visual.models.qwen2_vl_config import QwenVisionConfig
from shared.vision_config import VisionConfig
from tools.vision_bench_models import QWEN25_VL_7B as QWEN25_VL_7B_CONFIG

ARCHS = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}

QWEN2_VL_7B = {  # Qwen/Qwen2-VL-7B-Instruct's vision_config
    "depth": 32,
    "embed_dim": 1280,
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_chans": 3,
    "hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "spatial_patch_size": 14,
    "temporal_patch_size": 2,
}
QWEN25_VL_7B = QWEN25_VL_7B_CONFIG["vision_config"]  # Qwen/Qwen2.5-VL-7B-Instruct's


def test_qwen2_vl_7b() -> None:
    cfg = _config("qwen2_vl", QWEN2_VL_7B)
    assert (cfg.width, cfg.mlp_width, cfg.out_width, cfg.act) == (1280, 5120, 3584, "quick_gelu")
    assert not cfg.rms_norm and cfg.window_size == 0 and cfg.patch_dim == 1176 and cfg.head_dim == 80


def test_qwen25_vl_7b() -> None:
    cfg = _config("qwen2_5_vl", QWEN25_VL_7B)
    assert (cfg.width, cfg.mlp_width, cfg.out_width, cfg.act) == (1280, 3420, 3584, "silu")
    assert cfg.rms_norm and cfg.window_blocks == 4 and cfg.full_blocks == (7, 15, 23, 31)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="not Qwen2-VL"):
        _config("llava", QWEN2_VL_7B)
    with pytest.raises(ValueError, match="window_size"):
        _config("qwen2_5_vl", QWEN25_VL_7B | {"window_size": 100})
    with pytest.raises(ValueError, match="fullatt_block_indexes"):
        _config("qwen2_5_vl", QWEN25_VL_7B | {"fullatt_block_indexes": [32]})


def _config(family: str, tower: dict) -> QwenVisionConfig:
    arch = ARCHS.get(family, "LlavaForConditionalGeneration")
    raw = {"architectures": [arch], "image_token_id": 7, "vision_config": tower}
    return QwenVisionConfig.of(VisionConfig.from_dict(raw, {}))
