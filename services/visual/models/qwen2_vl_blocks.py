"""A Qwen2-VL / Qwen2.5-VL vision block and the patch merger, as PyTorch modules whose parameter
names are the checkpoint's (``blocks.{i}.norm1.weight``, ``merger.mlp.0.bias``, ...), so a
state dict read from the checkpoint loads into them as it is.

A block: x + attn(norm1(x)), then + mlp(norm2(x)). Attention is bidirectional within segments
(each frame, or each window; Segments) with the 2-D rotary turning q and k in float32: one PyTorch
SDPA call per segment length, the segments of that length stacked as its batch, so a batch of
same-sized images (or a frame's equal windows) costs a few calls a block, not one a segment.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from services.visual.models.qwen2_vl_config import QwenVisionConfig


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "silu":
        return F.silu(x)
    if name in ("gelu", "gelu_pytorch_tanh"):
        return F.gelu(x, approximate="tanh" if name == "gelu_pytorch_tanh" else "none")
    raise ValueError(f"vision activation {name!r} is not supported")


class RMSNorm(nn.Module):
    """Normalised in float32, rounded to x's dtype, then times the weight."""

    def __init__(self, n: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def norm(cfg: QwenVisionConfig) -> nn.Module:
    return RMSNorm(cfg.width) if cfg.rms_norm else nn.LayerNorm(cfg.width, eps=1e-6)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, D] turned by cos, sin [N, D] (rotate-half layout) in float32 -> x's dtype."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class Segments:
    """The segments attention runs within, grouped by length: for each length n, the rows of its
    segments as a [segments, n] index on the device. Built once per encode from cu_seqlens."""

    def __init__(self, cu_seqlens: torch.Tensor, device: torch.device | str) -> None:
        starts: defaultdict[int, list[int]] = defaultdict(list)
        for s, e in itertools.pairwise(cu_seqlens.tolist()):
            starts[e - s].append(s)
        self.groups = [(torch.tensor(ss)[:, None] + torch.arange(n)).to(device) for n, ss in starts.items()]


class Attention(nn.Module):
    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        """x [N, W] -> [N, W], each patch attending to the patches of its segment."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.heads, -1).unbind(1)  # each [N, heads, D]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = torch.empty_like(q)
        for rows in segments.groups:  # [S, L]
            qs, ks, vs = (t[rows].transpose(1, 2) for t in (q, k, v))  # [S, heads, L, D]
            out[rows] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2)
        return self.proj(out.reshape(n, -1))


class Mlp(nn.Module):
    """Qwen2-VL's: fc2(act(fc1(x)))."""

    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.act = cfg.act
        self.fc1 = nn.Linear(cfg.width, cfg.mlp_width)
        self.fc2 = nn.Linear(cfg.mlp_width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(activation(self.act, self.fc1(x)))


class GatedMlp(nn.Module):
    """Qwen2.5-VL's: down(act(gate(x)) * up(x)), with biases."""

    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.act = cfg.act
        self.gate_proj = nn.Linear(cfg.width, cfg.mlp_width)
        self.up_proj = nn.Linear(cfg.width, cfg.mlp_width)
        self.down_proj = nn.Linear(cfg.mlp_width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(activation(self.act, self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.norm1 = norm(cfg)
        self.norm2 = norm(cfg)
        self.attn = Attention(cfg)
        self.mlp = GatedMlp(cfg) if cfg.family == "qwen2_5_vl" else Mlp(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, segments)
        return x + self.mlp(self.norm2(x))


class Merger(nn.Module):
    """Each merge x merge block of patches (consecutive rows of x) -> one language-model token:
    norm, the block's patches side by side, Linear, GELU, Linear."""

    def __init__(self, cfg: QwenVisionConfig) -> None:
        super().__init__()
        self.ln_q = norm(cfg)
        self.merged = cfg.width * cfg.merge_size**2
        self.mlp = nn.Sequential(nn.Linear(self.merged, self.merged), nn.GELU(), nn.Linear(self.merged, cfg.out_width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[N, W] -> [N / merge^2, out_width]."""
        return self.mlp(self.ln_q(x).view(-1, self.merged))
