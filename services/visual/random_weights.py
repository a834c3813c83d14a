"""Random vision towers drawn from a seed on the device, at the shapes config.json gives: for
benchmarks at real shapes where no checkpoint can be downloaded (--random-weights true, as the
worker's). The embeddings are meaningless; the work per image is the real model's.

LLaVA's tower and projector read their tensors by name through a checkpoint; RandomCheckpoint
answers those names with draws of the shapes the names have in llava-hf's layout. Qwen2-VL's tower
is a module: it is built empty on the device and each parameter drawn in place. Matrices have a
standard deviation of 1/sqrt(fan_in), so activations stay of order one through every block.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from shared.vision_config import VisionConfig

LLAVA_TOWER = "vision_tower.vision_model."  # llava-hf's names, the first LlavaTower looks for


def llava_shapes(cfg: VisionConfig, text_hidden: int) -> dict[str, tuple[int, ...]]:
    """Every tensor LLaVA's (or LLaVA-NeXT's) tower and projector read -> its shape."""
    t = cfg.tower
    h = int(t.get("hidden_size", 768))
    inter, patch, channels = int(t.get("intermediate_size", 3072)), cfg.patch_size, int(t.get("num_channels", 3))
    v = LLAVA_TOWER
    shapes: dict[str, tuple[int, ...]] = {
        v + "embeddings.class_embedding": (h,),
        v + "embeddings.patch_embedding.weight": (h, channels, patch, patch),
        v + "embeddings.position_embedding.weight": (cfg.patches_per_side**2 + 1, h),
        v + "pre_layrnorm.weight": (h,),
        v + "pre_layrnorm.bias": (h,),
    }
    for i in range(int(t.get("num_hidden_layers", 12))):
        p = f"{v}encoder.layers.{i}."
        for name, out_f, in_f in (
            *((f"self_attn.{n}_proj", h, h) for n in ("q", "k", "v", "out")),
            ("mlp.fc1", inter, h),
            ("mlp.fc2", h, inter),
        ):
            shapes[p + name + ".weight"], shapes[p + name + ".bias"] = (out_f, in_f), (out_f,)
        for n in ("layer_norm1", "layer_norm2"):
            shapes[p + n + ".weight"], shapes[p + n + ".bias"] = (h,), (h,)
    for name, out_f, in_f in (("linear_1", text_hidden, h), ("linear_2", text_hidden, text_hidden)):
        shapes[f"multi_modal_projector.{name}.weight"] = (out_f, in_f)
        shapes[f"multi_modal_projector.{name}.bias"] = (out_f,)
    if cfg.family == "llava_next":
        shapes["image_newline"] = (text_hidden,)
    return shapes


def draw(name: str, shape: tuple[int, ...], g: torch.Generator, dtype: torch.dtype, device: torch.device):
    """One tensor: a norm's weight near one, a bias or an embedding small, a matrix (or a
    convolution's kernel) at 1/sqrt(fan_in)."""
    x = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
    if len(shape) == 1 and name.endswith("weight"):  # a norm's: every 1-D weight of these towers
        x = 1.0 + 0.05 * x
    elif len(shape) >= 2 and not name.endswith("embedding.weight"):
        x = x * math.prod(shape[1:]) ** -0.5
    else:
        x = 0.02 * x
    return x.to(dtype)


class RandomCheckpoint:
    """What LlavaTower and LlavaNextTower ask of a Checkpoint (get, has, put, dtype), each tensor
    drawn on the device when first read."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device, seed: int):
        self.shapes = shapes
        self.dtype = dtype
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def get(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(f"{name} is not a tensor of this tower")
        return draw(name, self.shapes[name], self.generator, self.dtype, self.device)

    def put(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.device, dtype=self.dtype).contiguous()


def randomize_(module: nn.Module, dtype: torch.dtype, device: torch.device, seed: int) -> nn.Module:
    """A module built on the meta device, its parameters drawn on the device in dtype (by name,
    as draw says); its buffers are left to the caller."""
    module.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.data = draw(name, tuple(p.shape), g, dtype, device)
    return module
