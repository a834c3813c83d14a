"""M-RoPE's rotary rows (Qwen2-VL): each token's cos | sin row put together from three positions.

The rotary frequencies are cut into three sections (mrope_section, in frequency order): the first
turns by the token's t position, the second by its h, the third by its w. A token's row of the
ordinary table (rope.py's cos_sin_table) is thus, column by column, the row of one of its three
positions. Gathering those rows once a step gives a table with one row per packed token, which
every rotary path (the ops' rotary_, the fused rotary-and-store kernel) reads at index t for token
t: the kernels take the positions they are given, three a token, without knowing of M-RoPE.

A token whose three positions are equal gets exactly the ordinary table's row at that position,
so text-only requests need no gather at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def section_streams(section: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """[head_dim] int64: for each column of a cos | sin row, which position stream (0 t, 1 h, 2 w) turns it."""
    half = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in enumerate(section)])
    return torch.cat([half, half]).to(device)


def mrope_cos_sin(cos_sin: torch.Tensor, positions: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """cos_sin [max_pos, D] (the ordinary table), positions [3, T] int64 (t, h, w of each token),
    streams [D] (section_streams) -> [T, D]: token t's row, each column from its stream's position."""
    if positions.dim() != 2 or positions.shape[0] != 3:
        raise ValueError(f"M-RoPE positions must be [3, T], got {tuple(positions.shape)}")
    rows = cos_sin[positions]  # [3, T, D]
    pick = streams.view(1, 1, -1).expand(1, positions.shape[1], -1)
    return rows.gather(0, pick)[0]
