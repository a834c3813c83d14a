"""How many prompt positions an image fills, per vision family: the count Hugging Face's
processor gives, which the family's tower in services/visual/families/ must produce. A new
family is one function here and a line in TOKEN_COUNTS."""

from __future__ import annotations

from collections.abc import Callable

from shared.anyres import grid, unpadded
from shared.vision_config import VisionConfig


def llava_tokens(cfg: VisionConfig, width: int, height: int) -> int:
    """LLaVA-1.5: one square whatever the image's size; a token per patch (and CLS if kept)."""
    return cfg.tokens_per_tile


def llava_next_tokens(cfg: VisionConfig, width: int, height: int) -> int:
    """LLaVA-NeXT: the whole image as one square, then the tiles' feature grid with the padding cut
    away and an image_newline ending each of its rows."""
    side = cfg.patches_per_side
    down, across = grid(height, width, cfg.grid_pinpoints, cfg.image_size)
    top, bottom, left, right = unpadded(height, width, down * side, across * side)
    rows, cols = bottom - top, right - left
    return cfg.tokens_per_tile + rows * cols + rows


TOKEN_COUNTS: dict[str, Callable[[VisionConfig, int, int], int]] = {
    "llava": llava_tokens,
    "llava_next": llava_next_tokens,
}


def image_tokens(cfg: VisionConfig) -> Callable[[int, int], int]:
    """(width, height) -> the image's prompt positions, for the model's family."""
    try:
        count = TOKEN_COUNTS[cfg.family]
    except KeyError:
        raise ValueError(
            f"no image token count for vision family {cfg.family!r}; known: {sorted(TOKEN_COUNTS)}"
        ) from None
    return lambda width, height: count(cfg, width, height)
