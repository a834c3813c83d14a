"""Qwen2-VL and Qwen2.5-VL: their own vision tower (services/visual/models/qwen2_vl_vision.py)
over the patches of an image resized to multiples of 28 pixels (processors/qwen2_vl.py). An
image's rows are its t * h * w / 4 merged patches in prompt order: the count and grid the front
end gives it (services/tokenizer/images/families.py), which the worker's M-RoPE positions follow.
Images of any sizes encode in one call, each frame attending only within itself."""

from __future__ import annotations

import torch
from PIL import Image

from services.visual.families.interface import Pixels
from services.visual.models.qwen2_vl_config import QwenVisionConfig
from services.visual.models.qwen2_vl_vision import QwenVisionTower, load_tower, random_tower
from services.visual.processors.qwen2_vl import QwenImageProcessor
from shared.vision_config import VisionConfig


class QwenTower:
    def __init__(self, cfg: VisionConfig, tower: QwenVisionTower, dtype: torch.dtype) -> None:
        self.proc = QwenImageProcessor.from_dict(cfg.processor)
        self.tower = tower
        if self.proc.merge_size != self.tower.cfg.merge_size or self.proc.patch_size != self.tower.cfg.patch_size:
            raise ValueError("the image processor's patch and merge sizes differ from the vision tower's")
        self.hidden_size = self.tower.cfg.out_width
        self.dtype = dtype

    def prepare(self, image: Image.Image) -> Pixels:
        patches, _ = self.proc.preprocess(image)  # [t * h * w, C * T * P * P]
        return Pixels(torch.from_numpy(patches), (image.height, image.width))

    def encode(self, images: list[Pixels]) -> list[torch.Tensor]:
        grids = [self.proc.grid(*p.size) for p in images]
        rows = self.tower.encode(torch.cat([p.values for p in images]), grids)  # [tokens of all, hidden]
        return list(rows.split(self.tower.token_counts(grids)))


def load(model_dir: str, cfg: VisionConfig, dtype: torch.dtype, device: torch.device) -> QwenTower:
    return QwenTower(cfg, load_tower(model_dir, QwenVisionConfig.of(cfg), dtype, device), dtype)


def random(cfg: VisionConfig, text_hidden: int, dtype: torch.dtype, device: torch.device, seed: int) -> QwenTower:
    """Weights drawn from seed on the device; the merger's output width is the config's (text_hidden unused)."""
    return QwenTower(cfg, random_tower(QwenVisionConfig.of(cfg), dtype, device, seed), dtype)
