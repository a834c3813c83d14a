"""An image file checked before anything is queued: Pillow must read it as an image, within the
byte and pixel limits (the pixel count read from its header, before it is decoded, so a small
file that expands to a huge bitmap is refused cheaply)."""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from services.tokenizer.errors import APIError


@dataclass(frozen=True)
class CheckedImage:
    hash: str  # sha256 of the file's bytes: its embeddings' key
    data: bytes
    width: int
    height: int


def check_image(data: bytes, param: str, max_bytes: int, max_pixels: int) -> CheckedImage:
    if len(data) > max_bytes:
        raise APIError(413, f"{param}: the image has {len(data)} bytes, over the limit of {max_bytes}", param=param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise APIError(
                    413, f"{param}: the image is {width}x{height} pixels, over the limit of {max_pixels}", param=param
                )
            image.load()  # decodes all of it: a truncated or corrupt file fails here
    except APIError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise APIError(
            400, f"{param}: the data is not an image Pillow can read ({type(e).__name__})", param=param
        ) from None
    except (OSError, SyntaxError, ValueError) as e:
        raise APIError(400, f"{param}: the image cannot be decoded: {e}", param=param) from None
    if width < 1 or height < 1:
        raise APIError(400, f"{param}: the image is empty", param=param)
    return CheckedImage(hashlib.sha256(data).hexdigest(), data, width, height)
