"""Where each patch of a batch of Qwen2-VL / Qwen2.5-VL images sits: its row and column (for the
2-D rotary), the segments attention runs within (each frame of each image, as cu_seqlens), and
Qwen2.5-VL's windows.

Patches arrive as the image processor lays them out (processors/qwen2_vl.py): image after
image, frame after frame, and within a frame merge block after merge block (row-major over the
merged grid), each block's merge x merge patches row-major. A window is a square of window_blocks
x window_blocks merge blocks (smaller at the right and bottom edges); window attention reorders
the merge blocks window after window (each window's blocks row-major), attends within each
window, and the merger's output is put back in the original order at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Grid = tuple[int, int, int]  # (t, h, w) in patches, as the image processor's image_grid_thw


def patch_positions(grids: Sequence[Grid], merge: int) -> torch.Tensor:
    """[patches, 2] int64: each patch's row and column in its frame."""
    out = []
    for t, h, w in grids:
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge, merge)
        # the processor's order: block row, block column, row in block, column in block
        rc = torch.stack([rows.permute(0, 2, 1, 3).flatten(), cols.permute(0, 2, 1, 3).flatten()], dim=-1)
        out.append(rc.repeat(t, 1))
    return torch.cat(out)


def frame_seqlens(grids: Sequence[Grid]) -> torch.Tensor:
    """[frames + 1] int32: cumulative patch counts, one segment per frame of each image."""
    lengths = [h * w for t, h, w in grids for _ in range(t)]
    return torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)


def windows(grids: Sequence[Grid], merge: int, window_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (order [blocks] int64: the merge blocks window after window, as indices into the
    processor's order; cu_window_seqlens [windows + 1] int32: cumulative patch counts)."""
    order, lengths, offset = [], [], 0
    for t, h, w in grids:
        gh, gw = h // merge, w // merge
        for frame in range(t):
            index = torch.arange(gh * gw).view(gh, gw) + offset + frame * gh * gw
            for r in range(0, gh, window_blocks):
                for c in range(0, gw, window_blocks):
                    block = index[r : r + window_blocks, c : c + window_blocks].flatten()
                    order.append(block)
                    lengths.append(block.numel() * merge * merge)
        offset += t * gh * gw
    cu = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0).to(torch.int32)
    return torch.cat(order), cu
