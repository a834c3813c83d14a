"""How many prompt positions an image fills, per vision family: the count Hugging Face's
processor gives, which the family's tower in services/visual/families/ must produce. A new
family is one function here and a line in TOKEN_COUNTS."""

from __future__ import annotations

from collections.abc import Callable

from shared.vision_config import VisionConfig


def llava_tokens(cfg: VisionConfig, width: int, height: int) -> int:
    """LLaVA-1.5: one square whatever the image's size; a token per patch (and CLS if kept)."""
    return cfg.tokens_per_tile


TOKEN_COUNTS: dict[str, Callable[[VisionConfig, int, int], int]] = {
    "llava": llava_tokens,
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
