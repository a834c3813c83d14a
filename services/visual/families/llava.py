"""LLaVA-1.5: a CLIP vision tower read at vision_feature_layer, the CLS position dropped or kept
(vision_feature_select_strategy), and a two-layer MLP projector into the language model's width.
An image is one square: resized on its shortest edge and centre-cropped (CLIP's processor)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from PIL import Image

from services.visual.clip import ClipTower
from services.visual.families.interface import Pixels
from services.visual.image_prep import ClipPrep
from services.visual.random_weights import RandomCheckpoint, llava_shapes
from services.worker.models.checkpoint import Checkpoint
from shared.vision_config import VisionConfig

# where checkpoints put the tower and the projector: llava-hf's layout, then transformers 5's
TOWER_PREFIXES = ("vision_tower.vision_model.", "model.vision_tower.vision_model.", "model.vision_tower.")
PROJECTOR_PREFIXES = ("multi_modal_projector.", "model.multi_modal_projector.")

_ACTS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


def prefix_of(ckpt: Checkpoint, candidates: tuple[str, ...], probe: str) -> str:
    for prefix in candidates:
        if ckpt.has(prefix + probe):
            return prefix
    raise ValueError(f"no {probe} under any of {candidates} in the checkpoint")


class Projector:
    def __init__(self, ckpt: Checkpoint, act: str) -> None:
        if act not in _ACTS:
            raise ValueError(f"projector_hidden_act {act!r} is not supported ({', '.join(_ACTS)})")
        p = prefix_of(ckpt, PROJECTOR_PREFIXES, "linear_1.weight")
        self.w1, self.b1 = (ckpt.put(ckpt.get(p + f"linear_1.{n}")) for n in ("weight", "bias"))
        self.w2, self.b2 = (ckpt.put(ckpt.get(p + f"linear_2.{n}")) for n in ("weight", "bias"))
        self.act = _ACTS[act]

    @property
    def out_features(self) -> int:
        return int(self.w2.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act(F.linear(x, self.w1, self.b1)), self.w2, self.b2)


class LlavaTower:
    def __init__(self, cfg: VisionConfig, ckpt: Checkpoint, device: torch.device) -> None:
        prefix = prefix_of(ckpt, TOWER_PREFIXES, "embeddings.class_embedding")
        self.tower = ClipTower(cfg.tower, ckpt, prefix, cfg.feature_layer)
        self.projector = Projector(ckpt, cfg.projector_act)
        self.prep = ClipPrep.of(cfg.processor, cfg.image_size)
        self.keep_cls = cfg.select_strategy == "full"
        self.hidden_size = self.projector.out_features
        self.dtype = ckpt.dtype
        self.device = device

    def prepare(self, image: Image.Image) -> Pixels:
        square = torch.from_numpy(self.prep.square(image))
        return Pixels(square[None], (image.height, image.width))

    @torch.inference_mode()
    def features(self, squares: torch.Tensor) -> torch.Tensor:
        """squares [B, 3, S, S] -> the projector's rows [B, tokens_per_tile, hidden_size]."""
        x = self.tower.features(squares.to(self.device))
        return self.projector(x if self.keep_cls else x[:, 1:])

    def encode(self, images: list[Pixels]) -> list[torch.Tensor]:
        rows = self.features(torch.cat([p.values for p in images]))
        return list(rows)  # one square an image


def load(model_dir: str, cfg: VisionConfig, dtype: torch.dtype, device: torch.device) -> LlavaTower:
    return LlavaTower(cfg, Checkpoint(model_dir, dtype, device, progress=False), device)


def random(cfg: VisionConfig, text_hidden: int, dtype: torch.dtype, device: torch.device, seed: int) -> LlavaTower:
    """Weights drawn from seed on the device (services/visual/random_weights.py)."""
    return LlavaTower(cfg, RandomCheckpoint(llava_shapes(cfg, text_hidden), dtype, device, seed), device)
