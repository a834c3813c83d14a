"""The Qwen2-VL / Qwen2.5-VL vision tower: pixel patches -> one embedding per language-model
image token.

    tower = load_tower(model_dir, QwenVisionConfig.of(model_config.vision), dtype, device)
    embeds = tower.encode(pixel_values, grids)  # [sum(t * h * w) / 4, LM hidden]
    per_image = embeds.split(tower.token_counts(grids))

pixel_values [patches, C * T * P * P] and grids ((t, h, w) in patches, one per image) are what
processors/qwen2_vl.py (and Hugging Face's Qwen2VLImageProcessor) give, images concatenated in
any number: each frame attends only within itself (cu_seqlens), so a batch of images from many
requests encodes in one call with each image's output as if alone. The rows of an image's output
are its image tokens in prompt order (merge blocks row-major), what the worker scatters into the
prompt's image positions (ForwardBatch.image_embeds).

Steps: patch embedding (the checkpoint's Conv3d, stride = kernel, as one matmul), the 2-D rotary
table (half of each head's frequencies turn by the patch's row, half by its column), the blocks
(Qwen2.5-VL: within windows, except the full-attention blocks; qwen2_vl_layout.py), the merger.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

import torch
from safetensors import safe_open
from torch import nn

from services.visual.models.qwen2_vl_blocks import Block, Merger, Segments
from services.visual.models.qwen2_vl_config import QwenVisionConfig
from services.visual.models.qwen2_vl_layout import Grid, frame_seqlens, patch_positions, windows
from services.visual.random_weights import randomize_

PREFIXES = ("visual.", "model.visual.")  # Qwen's checkpoints and transformers 5; transformers 4.5x


class PatchEmbed(nn.Module):
    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        p, t = cfg.patch_size, cfg.temporal_patch_size
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.empty(cfg.width, cfg.in_channels, t, p, p))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[N, C * T * P * P] -> [N, width]."""
        w = self.proj.weight
        return pixels.to(w.dtype) @ w.view(w.shape[0], -1).t()


class QwenVisionTower(nn.Module):
    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.merger = Merger(cfg)
        self.register_buffer("inv_freq", inverse_frequencies(cfg), persistent=False)  # [head_dim / 4]

    def token_counts(self, grids: Sequence[Grid]) -> list[int]:
        """Each image's language-model tokens: t * h * w / merge^2."""
        return [t * h * w // self.cfg.merge_size**2 for t, h, w in grids]

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        """pixel_values [patches, patch_dim], grids -> [patches / merge^2, out_width]."""
        cfg = self.cfg
        grids = [tuple(int(n) for n in g) for g in grids]
        if pixel_values.shape != (sum(t * h * w for t, h, w in grids), cfg.patch_dim):
            raise ValueError(f"pixel_values {tuple(pixel_values.shape)} do not fit grids {grids}")
        device = self.inv_freq.device
        x = self.patch_embed(pixel_values.to(device))  # [N, width]
        angles = patch_positions(grids, cfg.merge_size).to(device)[..., None].float() * self.inv_freq  # [N, 2, D/4]
        angles = angles.flatten(1)  # [N, D / 2]: row frequencies, then column ones
        table = torch.cat([angles, angles], dim=-1)  # [N, D]
        full = in_windows = Segments(frame_seqlens(grids), device)  # each frame
        order = None
        if cfg.window_size:  # each window, the merge blocks reordered window after window
            order, cu_windows = windows(grids, cfg.merge_size, cfg.window_blocks)
            in_windows = Segments(cu_windows, device)
            x, table = (_by_block(a, order.to(device), cfg.merge_size) for a in (x, table))
        cos, sin = table.cos(), table.sin()
        for i, block in enumerate(self.blocks):
            windowed = order is not None and i not in cfg.full_blocks
            x = block(x, cos, sin, in_windows if windowed else full)
        out = self.merger(x)  # [N / merge^2, out_width]
        return out if order is None else out[torch.argsort(order.to(device))]


def inverse_frequencies(cfg: QwenVisionConfig) -> torch.Tensor:
    """[head_dim / 4] float32: the rotary frequencies each of the row and the column turns."""
    half = cfg.head_dim // 2
    return 1.0 / cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half)


def _by_block(x: torch.Tensor, order: torch.Tensor, merge: int) -> torch.Tensor:
    """x's rows in merge blocks of merge^2 rows, the blocks taken in order."""
    unit = merge * merge
    return x.view(-1, unit, *x.shape[1:])[order].flatten(0, 1)


def load_tower(
    model_dir: str, cfg: QwenVisionConfig, dtype: torch.dtype, device: torch.device | str
) -> QwenVisionTower:
    """The tower with the checkpoint's visual.* (or model.visual.*) tensors; every one must be there."""
    tensors = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                prefix = next((p for p in PREFIXES if name.startswith(p)), None)
                if prefix is not None:
                    tensors[name[len(prefix) :]] = f.get_tensor(name)
    if not tensors:
        raise ValueError(f"no vision tower tensors (visual.* or model.visual.*) in {model_dir}")
    with torch.device("meta"):
        tower = QwenVisionTower(cfg)
    tower.load_state_dict(tensors, strict=True, assign=True)
    tower.inv_freq = torch.empty(0)  # not in the checkpoint: off the meta device before the move
    tower.to(device=device, dtype=dtype)
    tower.inv_freq = inverse_frequencies(cfg).to(device)  # float32 whatever the weights' dtype
    return tower.eval()


def random_tower(cfg: QwenVisionConfig, dtype: torch.dtype, device: torch.device, seed: int) -> QwenVisionTower:
    """The tower with weights drawn from seed on the device (services/visual/random_weights.py)."""
    with torch.device("meta"):
        tower = QwenVisionTower(cfg)
    randomize_(tower, dtype, device, seed)
    tower.inv_freq = inverse_frequencies(cfg).to(device)
    return tower.eval()
