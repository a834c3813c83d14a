"""Vision families by name: what loads each one's tower (shared/vision_config.py names the
family). A new family is its own file here with a ``load``, one line in FAMILIES, and the
front end's count of its image tokens (services/tokenizer/images/families.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from services.visual.families import llava, llava_next, qwen2_vl
from services.visual.families.interface import VisionTower
from shared.vision_config import VisionConfig

Loader = Callable[[str, VisionConfig, torch.dtype, torch.device], VisionTower]
# (config, the language model's width, dtype, device, seed) -> a tower of random weights
RandomLoader = Callable[[VisionConfig, int, torch.dtype, torch.device, int], VisionTower]

FAMILIES: dict[str, Loader] = {
    "llava": llava.load,
    "llava_next": llava_next.load,
    "qwen2_vl": qwen2_vl.load,
    "qwen2_5_vl": qwen2_vl.load,
}

RANDOM: dict[str, RandomLoader] = {
    "llava": llava.random,
    "llava_next": llava_next.random,
    "qwen2_vl": qwen2_vl.random,
    "qwen2_5_vl": qwen2_vl.random,
}


def load_tower(model_dir: str, cfg: VisionConfig, dtype: torch.dtype, device: torch.device) -> VisionTower:
    try:
        loader = FAMILIES[cfg.family]
    except KeyError:
        raise ValueError(f"no vision tower for family {cfg.family!r}; known: {sorted(FAMILIES)}") from None
    return loader(model_dir, cfg, dtype, device)


def random_tower(
    cfg: VisionConfig, text_hidden: int, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> VisionTower:
    """The family's tower with weights drawn from seed on the device: benchmarks at real shapes."""
    if cfg.family not in RANDOM:
        raise ValueError(f"no vision tower for family {cfg.family!r}; known: {sorted(RANDOM)}")
    return RANDOM[cfg.family](cfg, text_hidden, dtype, device, seed)
