"""LLaVA-NeXT: LLaVA-1.5's tower and projector over several squares of one image: the whole image
squeezed into one, then tiles of the image resized into the best grid resolution of
image_grid_pinpoints. An image's rows: the whole image's features, then the tiles' features as
one grid, the padding around the resized image cut away (unpadding), with the learned
image_newline after each of its rows."""

from __future__ import annotations

import torch
from PIL import Image

from services.visual.families.interface import Pixels
from services.visual.families.llava import LlavaTower, prefix_of
from services.visual.image_prep import anyres_tiles
from services.visual.random_weights import RandomCheckpoint, llava_shapes
from services.worker.models.checkpoint import Checkpoint
from shared.anyres import grid, unpadded
from shared.vision_config import VisionConfig


class LlavaNextTower:
    def __init__(self, cfg: VisionConfig, ckpt: Checkpoint, device: torch.device) -> None:
        self.core = LlavaTower(cfg, ckpt, device)  # the tower and projector, run on every square
        self.cfg = cfg
        newline = prefix_of(ckpt, ("", "model."), "image_newline") + "image_newline"
        self.newline = ckpt.put(ckpt.get(newline))  # [hidden]
        self.hidden_size = self.core.hidden_size
        self.dtype = self.core.dtype

    def prepare(self, image: Image.Image) -> Pixels:
        tiles = anyres_tiles(image, self.core.prep, self.cfg.grid_pinpoints, self.cfg.image_size)
        return Pixels(torch.from_numpy(tiles), (image.height, image.width))

    def encode(self, images: list[Pixels]) -> list[torch.Tensor]:
        rows = self.core.features(torch.cat([p.values for p in images]))  # [squares, side^2, hidden]
        out, at = [], 0
        for p in images:
            n = p.values.shape[0]
            out.append(self._layout(rows[at : at + n], p.size))
            at += n
        return out

    def _layout(self, rows: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        """One image's squares' rows [1 + tiles, side^2, hidden] -> its embeddings [tokens, hidden]."""
        side = self.cfg.patches_per_side
        down, across = grid(size[0], size[1], self.cfg.grid_pinpoints, self.cfg.image_size)
        tiles = rows[1:].view(down, across, side, side, -1)  # tile row, tile column, patch row, patch column
        features = tiles.permute(0, 2, 1, 3, 4).reshape(down * side, across * side, -1)  # [grid rows, grid cols, H]
        top, bottom, left, right = unpadded(size[0], size[1], down * side, across * side)
        features = features[top:bottom, left:right]
        newline = self.newline.to(features.dtype).expand(features.shape[0], 1, -1)
        features = torch.cat([features, newline], dim=1).flatten(0, 1)  # row by row, each ended by image_newline
        return torch.cat([rows[0], features])


def load(model_dir: str, cfg: VisionConfig, dtype: torch.dtype, device: torch.device) -> LlavaNextTower:
    return LlavaNextTower(cfg, Checkpoint(model_dir, dtype, device, progress=False), device)


def random(cfg: VisionConfig, text_hidden: int, dtype: torch.dtype, device: torch.device, seed: int) -> LlavaNextTower:
    """Weights drawn from seed on the device (services/visual/random_weights.py)."""
    return LlavaNextTower(cfg, RandomCheckpoint(llava_shapes(cfg, text_hidden), dtype, device, seed), device)
