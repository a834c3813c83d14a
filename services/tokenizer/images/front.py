"""A request's images from the front end's side: read and checked, then the prompt expanded.

The chat template (or the client, on /generate) writes one placeholder token per image; each
becomes as many positions as the family's processor gives the image, holding the image's
pseudo-id (shared.vision_config.image_pseudo_id), and an ImageRef says where they are (and, for
Qwen2-VL, their grid, which the worker's M-RoPE positions follow). The visual service turns the
image's bytes into the rows that fill them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.tokenizer.errors import APIError
from services.tokenizer.images.check import CheckedImage, check_image
from services.tokenizer.images.families import image_layout
from services.tokenizer.images.sources import ImageSource, ImageSources
from shared.config import TokenizerConfig
from shared.messages import ImageData, ImageRef
from shared.vision_config import VisionConfig, image_pseudo_id


@dataclass(frozen=True)
class PromptImages:
    """What a request with images sends: the expanded prompt's images and their files."""

    refs: list[ImageRef]
    data: list[ImageData]  # one per distinct image

    @property
    def tokens(self) -> int:
        return sum(r.length for r in self.refs)


class ImageFront:
    def __init__(self, cfg: TokenizerConfig, vision: VisionConfig | None, placeholder: str) -> None:
        """vision: None for a text-only model; placeholder: the image token's text ("<image>")."""
        self.vision = vision
        self.placeholder = placeholder
        self.max_images = cfg.max_images_per_request
        self.max_bytes = cfg.max_image_bytes
        self.max_pixels = cfg.max_image_pixels
        self.sources = ImageSources(cfg.allowed_image_domains, cfg.max_image_bytes, cfg.image_fetch_timeout_s)
        self._layout = image_layout(vision) if vision is not None else None

    async def load(self, sources: list[ImageSource]) -> list[CheckedImage]:
        """Each image read and checked, in order."""
        if not sources:
            return []
        param = sources[0].param
        if self.vision is None:
            raise APIError(400, f"{param}: the served model is text-only: it takes no images", param=param)
        if len(sources) > self.max_images:
            raise APIError(
                400, f"{len(sources)} images in one request, over the limit of {self.max_images}", param=param
            )
        loop = asyncio.get_running_loop()
        out = []
        for source in sources:
            data = await self.sources.read(source)
            # decoding is CPU work: off the event loop
            checked = await loop.run_in_executor(None, check_image, data, source.param, self.max_bytes, self.max_pixels)
            out.append(checked)
        return out

    def expand(self, ids: list[int], images: list[CheckedImage], param: str) -> tuple[list[int], PromptImages | None]:
        """The prompt with each image's placeholder expanded to its positions -> (ids, images)."""
        if self.vision is None or self._layout is None:
            return ids, None
        token = self.vision.image_token_id
        where = [i for i, t in enumerate(ids) if t == token]
        if len(where) != len(images):
            raise APIError(
                400,
                f"{param}: {len(images)} images given, but the prompt has {len(where)} {self.placeholder} "
                "placeholders: one for each image",
                param=param,
            )
        if not images:
            return ids, None
        out: list[int] = []
        refs: list[ImageRef] = []
        last = 0
        for at, image in zip(where, images, strict=True):
            out += ids[last:at]
            n, grid = self._layout(image.width, image.height)
            refs.append(ImageRef(image.hash, len(out), n, list(grid)))
            out += [image_pseudo_id(image.hash)] * n
            last = at + 1
        out += ids[last:]
        distinct = {i.hash: ImageData(i.hash, i.data) for i in images}
        return out, PromptImages(refs, list(distinct.values()))
