"""Rotary position embedding tables, with the scalings Llama-family and Phi-3 configs use.

The table holds cos and sin of position * inverse frequency for every position the
model serves, computed in float32 exactly as Hugging Face does, so the kernels only
look rows up.

LongRoPE (Phi-3) scales each inverse frequency by its own factor and cos and sin by an
attention factor. Hugging Face picks the factor list by the current sequence length: the
short list while the sequence is at most original_max_position_embeddings long, the long one
beyond (and then recomputes the whole cache). One table cannot change under a cached
sequence, so it holds the short list, and shared/model_config.py caps the context at
original_max_position_embeddings, where that is exact.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any]) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies after the config's rope scaling."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "longrope":
        # Hugging Face's order of operations: factor * theta^(2i / d), then the reciprocal
        short = torch.tensor(scaling["short_factor"], dtype=torch.float32)
        return 1.0 / (short * theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    if rope_type == "llama3":
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope type {rope_type!r}")


def attention_scaling(scaling: dict[str, Any]) -> float:
    """What cos and sin are multiplied by: LongRoPE's attention factor (config.json's, else
    sqrt(1 + ln(factor) / ln(original context)), factor being the extended context over the
    original), 1 for the other scalings."""
    if scaling.get("rope_type") != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(int(scaling["original_max_position_embeddings"])))


def cos_sin_table(
    head_dim: int, theta: float, scaling: dict[str, Any], max_positions: int, device: torch.device | str
) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half of each row, sin in the second,
    each times the scaling's attention factor."""
    inv_freq = inverse_frequencies(head_dim, theta, scaling)
    positions = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(positions, inv_freq)  # [max_positions, head_dim // 2]
    scale = attention_scaling(scaling)
    table = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    return (table if scale == 1.0 else table * scale).to(device)
