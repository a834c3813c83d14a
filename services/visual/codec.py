"""A tensor of embeddings as the ImageEmbedding message that Redis holds, and back: the bytes
as they lie in memory, with their dtype and shape (shared/ has no torch, so the conversion is here;
the worker reads with it too)."""

from __future__ import annotations

import torch

from shared.messages import ImageEmbedding

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_NAMES = {v: k for k, v in _DTYPES.items()}


def to_message(rows: torch.Tensor) -> ImageEmbedding:
    """rows [tokens, hidden] -> its message (copied to the host)."""
    if rows.dim() != 2 or rows.dtype not in _NAMES:
        raise ValueError(f"embeddings must be 2-D {sorted(_DTYPES)}, got {tuple(rows.shape)} {rows.dtype}")
    data = rows.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return ImageEmbedding(_NAMES[rows.dtype], list(rows.shape), data)


def from_message(msg: ImageEmbedding) -> torch.Tensor:
    """-> [tokens, hidden] on the host, in the dtype it was stored in."""
    flat = torch.frombuffer(bytearray(msg.data), dtype=torch.uint8)
    return flat.view(_DTYPES[msg.dtype]).view(*msg.shape)
