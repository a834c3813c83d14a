"""How many prompt positions an image fills, per vision family: the count Hugging Face's
processor gives, which the family's tower in services/visual/families/ must produce, and, for a
family whose positions follow the image's layout (Qwen2-VL's M-RoPE), the grid of those
positions. A new family is one function here and a line in LAYOUTS."""

from __future__ import annotations

from collections.abc import Callable

from services.visual.processors.qwen2_vl import QwenImageProcessor
from shared.anyres import grid, unpadded
from shared.vision_config import VisionConfig

Layout = tuple[int, tuple[int, ...]]  # (positions, their (t, h, w) grid or () where positions ignore it)


def llava_tokens(cfg: VisionConfig, width: int, height: int) -> Layout:
    """LLaVA-1.5: one square whatever the image's size; a token per patch (and CLS if kept)."""
    return cfg.tokens_per_tile, ()


def llava_next_tokens(cfg: VisionConfig, width: int, height: int) -> Layout:
    """LLaVA-NeXT: the whole image as one square, then the tiles' feature grid with the padding cut
    away and an image_newline ending each of its rows."""
    side = cfg.patches_per_side
    down, across = grid(height, width, cfg.grid_pinpoints, cfg.image_size)
    top, bottom, left, right = unpadded(height, width, down * side, across * side)
    rows, cols = bottom - top, right - left
    return cfg.tokens_per_tile + rows * cols + rows, ()


def qwen_vl_tokens(cfg: VisionConfig, width: int, height: int) -> Layout:
    """Qwen2-VL and Qwen2.5-VL: the image resized to multiples of 28 pixels within the processor's
    pixel bounds, one token per 2x2 patches of 14 pixels; the grid in tokens (M-RoPE's)."""
    proc = QwenImageProcessor.from_dict(cfg.processor)
    t, h, w = proc.grid(height, width)  # in patches
    m = proc.merge_size
    return t * (h // m) * (w // m), (t, h // m, w // m)


LAYOUTS: dict[str, Callable[[VisionConfig, int, int], Layout]] = {
    "llava": llava_tokens,
    "llava_next": llava_next_tokens,
    "qwen2_vl": qwen_vl_tokens,
    "qwen2_5_vl": qwen_vl_tokens,
}


def image_layout(cfg: VisionConfig) -> Callable[[int, int], Layout]:
    """(width, height) -> the image's prompt positions and their grid, for the model's family."""
    try:
        layout = LAYOUTS[cfg.family]
    except KeyError:
        raise ValueError(f"no image layout for vision family {cfg.family!r}; known: {sorted(LAYOUTS)}") from None
    return lambda width, height: layout(cfg, width, height)
