"""An image file's bytes -> the tower's input, as Hugging Face's CLIP image processor (its PIL
backend) makes it: RGB, the shortest edge resized to the processor's size (PIL's bicubic), a
centre crop, rescaled to [0, 1] and normalised per channel. preprocessor_config.json says each
step's numbers."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from shared.anyres import best_resolution, fitted_size

_RESAMPLE = {0: Image.Resampling.NEAREST, 2: Image.Resampling.BILINEAR, 3: Image.Resampling.BICUBIC}


def open_rgb(data: bytes) -> Image.Image:
    """The image in data as RGB (the front end checked that it is one)."""
    image = Image.open(io.BytesIO(data))
    image.load()
    return image.convert("RGB")


@dataclass(frozen=True)
class ClipPrep:
    shortest_edge: int
    crop: tuple[int, int]  # height, width
    resample: Image.Resampling
    rescale: float
    mean: np.ndarray  # [3] float32
    std: np.ndarray

    @classmethod
    def of(cls, cfg: dict[str, Any], image_size: int) -> ClipPrep:
        size = cfg.get("size") or {"shortest_edge": image_size}
        crop = cfg.get("crop_size") or {"height": image_size, "width": image_size}
        resample = int(cfg.get("resample", 3))
        if resample not in _RESAMPLE:
            raise ValueError(f"image processor resample {resample} is not supported ({sorted(_RESAMPLE)})")
        if not cfg.get("do_center_crop", True) or not cfg.get("do_normalize", True):
            raise ValueError("an image processor without centre crop or normalisation is not supported")
        return cls(
            shortest_edge=int(size.get("shortest_edge") or size.get("height")),
            crop=(int(crop["height"]), int(crop["width"])),
            resample=_RESAMPLE[resample],
            rescale=float(cfg.get("rescale_factor", 1 / 255)),
            mean=np.asarray(cfg.get("image_mean", [0.5] * 3), dtype=np.float32),
            std=np.asarray(cfg.get("image_std", [0.5] * 3), dtype=np.float32),
        )

    def resize_short(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(self.shortest_edge * long / short)
        size = (self.shortest_edge, new_long) if w <= h else (new_long, self.shortest_edge)
        return image.resize(size, self.resample)

    def square(self, image: Image.Image) -> np.ndarray:
        """A resized, cropped and normalised image -> [3, crop_h, crop_w] float32."""
        return self.normalise(centre_crop(np.asarray(self.resize_short(image)), self.crop))

    def normalise(self, hwc: np.ndarray) -> np.ndarray:
        """uint8 [h, w, 3] -> float32 [3, h, w]."""
        x = (hwc.astype(np.float64) * self.rescale).astype(np.float32)
        return ((x - self.mean) / self.std).transpose(2, 0, 1).copy()


def anyres_tiles(image: Image.Image, prep: ClipPrep, pinpoints: tuple[tuple[int, int], ...], side: int) -> np.ndarray:
    """LLaVA-NeXT's input: the whole image squeezed into one square, then the image resized into
    the best of pinpoints (aspect kept, zero padding around it) cut into squares row by row ->
    [1 + tiles, 3, side, side] float32, as Hugging Face's LlavaNext image processor makes it."""
    best = best_resolution(image.height, image.width, pinpoints)
    h, w = fitted_size(image.height, image.width, best)
    fitted = np.asarray(image.resize((w, h), prep.resample))
    (top, extra_y), (left, extra_x) = divmod(best[0] - h, 2), divmod(best[1] - w, 2)
    padded = np.pad(fitted, ((top, top + extra_y), (left, left + extra_x), (0, 0)))
    squares = [image.resize((side, side), prep.resample)]
    squares += [
        Image.fromarray(padded[y : y + side, x : x + side])
        for y in range(0, best[0], side)
        for x in range(0, best[1], side)
    ]
    return np.stack([prep.square(s) for s in squares])


def centre_crop(hwc: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """The middle crop[0] x crop[1] of an image, padded with zeros where it is smaller."""
    ch, cw = crop
    h, w = hwc.shape[:2]
    if ch > h or cw > w:
        padded = np.zeros((max(h, ch), max(w, cw), hwc.shape[2]), dtype=hwc.dtype)
        top, left = (max(h, ch) - h) // 2, (max(w, cw) - w) // 2
        padded[top : top + h, left : left + w] = hwc
        hwc, h, w = padded, max(h, ch), max(w, cw)
    top, left = (h - ch) // 2, (w - cw) // 2
    return hwc[top : top + ch, left : left + cw]
