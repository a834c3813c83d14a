"""The visual service's random towers (services/visual/random_weights.py, --random-weights true):
each family's tower drawn from a seed at the shapes its config gives, encoding an image into as many
rows of the language model's width as the checkpoint's tower does, the same for the same seed."""

from __future__ import annotations

import pytest
import torch

from services.visual.families import load_tower, random_tower
from services.visual.image_prep import open_rgb
from shared.model_config import ModelConfig
from tests import vision_cases as vc

CPU = torch.device("cpu")


@pytest.mark.parametrize("which", ["llava", "llava_next", "qwen2_5_vl"])
def test_random_tower_encodes_as_the_checkpoint_shapes(
    which: str, tiny_llava: str, tiny_llava_next: str, tiny_vl_models: dict[str, str]
) -> None:
    model_dir = {"llava": tiny_llava, "llava_next": tiny_llava_next}.get(which) or tiny_vl_models[which]
    cfg = ModelConfig.from_dir(model_dir)
    image = open_rgb(vc.png(vc.image(1, 60, 40)))
    real = load_tower(model_dir, cfg.vision, torch.float32, CPU)
    want = real.encode([real.prepare(image)])[0]
    drawn = [random_tower(cfg.vision, cfg.hidden_size, torch.float32, CPU, seed=0) for _ in range(2)]
    got = [t.encode([t.prepare(image)])[0] for t in drawn]
    assert got[0].shape == want.shape and got[0].dtype == torch.float32
    assert torch.isfinite(got[0]).all() and torch.equal(got[0], got[1])  # the same seed, the same weights
    assert not torch.allclose(got[0], want)  # drawn, not read


def test_unknown_family_is_refused(tiny_llava: str) -> None:
    from dataclasses import replace

    vision = replace(ModelConfig.from_dir(tiny_llava).vision, family="nope")
    with pytest.raises(ValueError, match="no vision tower for family 'nope'"):
        random_tower(vision, 64, torch.float32, CPU)
