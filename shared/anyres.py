"""LLaVA-NeXT's any-resolution geometry, which the front end (how many tokens an image becomes)
and the visual service (how its tiles' features are laid out) must agree on: the grid
resolution an image is resized into, and the part of the feature grid left once the padding
around the resized image is cut away. The arithmetic of Hugging Face's LlavaNext processor and
model, rounding included."""

from __future__ import annotations

import math


def best_resolution(height: int, width: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The (height, width) among pinpoints that keeps most of the image's pixels, then wastes fewest."""
    best, most, waste = pinpoints[0], -1, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = w * h - effective
        if effective > most or (effective == most and wasted < waste):
            best, most, waste = (h, w), effective, wasted
    return best


def fitted_size(height: int, width: int, target: tuple[int, int]) -> tuple[int, int]:
    """(height, width) of the image resized to fit target, its aspect ratio kept (rounded up)."""
    th, tw = target
    if tw / width < th / height:
        return min(math.ceil(height * tw / width), th), tw
    return th, min(math.ceil(width * th / height), tw)


def unpadded(height: int, width: int, rows: int, cols: int) -> tuple[int, int, int, int]:
    """Of a rows x cols feature grid over the padded image, the part the image covers:
    (top, bottom, left, right) bounds, the padding cut evenly from both sides."""
    if width / height > cols / rows:
        new_rows = int(round(height * (cols / width), 7))
        pad = (rows - new_rows) // 2
        return pad, rows - pad, 0, cols
    new_cols = int(round(width * (rows / height), 7))
    pad = (cols - new_cols) // 2
    return 0, rows, pad, cols - pad


def grid(height: int, width: int, pinpoints: tuple[tuple[int, int], ...], tile: int) -> tuple[int, int]:
    """How many tiles of side tile the image is cut into: (down, across)."""
    h, w = best_resolution(height, width, pinpoints)
    return h // tile, w // tile
