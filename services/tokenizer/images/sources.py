"""Where an image's bytes come from, as a client names it: a data: URL, bare base64 (LightLLM's
{"type": "base64"} and FastChat's images), or an http(s) URL, fetched only from the hosts
--allowed-image-domains names, within a size and a time limit. Nothing else is read: no file
paths, no file: URLs, no other schemes."""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from typing import NamedTuple

import httpx

from services.tokenizer.errors import APIError


class ImageSource(NamedTuple):
    """An image as a request names it, and the parameter that does (for the error messages)."""

    text: str  # a data: or http(s) URL, or base64
    param: str
    bare_base64: bool = False  # the text is base64 whatever it looks like (LightLLM's type "base64")


class ImageSources:
    def __init__(self, allowed_domains: tuple[str, ...], max_bytes: int, timeout_s: float) -> None:
        self.allowed_domains = allowed_domains
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def read(self, image: ImageSource) -> bytes:
        """The image file's bytes, from a data: or http(s) URL or base64."""
        source, param = image.text, image.param
        if image.bare_base64:
            return self.base64(source, param)
        if source.startswith("data:"):
            return self._data_url(source, param)
        scheme = urllib.parse.urlsplit(source).scheme.lower()
        if scheme in ("http", "https"):
            return await self._fetch(source, param)
        if scheme or source.startswith(("/", "./", "../", "~")):
            raise APIError(
                400, f"{param}: only data:, http: and https: image URLs are taken, not {source[:60]!r}", param=param
            )
        return self.base64(source, param)

    def base64(self, text: str, param: str) -> bytes:
        """Bare base64 (standard or URL-safe alphabet, padding optional) -> bytes."""
        raw = "".join(text.split())
        if len(raw) * 3 // 4 > self.max_bytes + 3:
            raise APIError(413, f"{param}: the image is over the limit of {self.max_bytes} bytes", param=param)
        try:
            altchars = b"-_" if ("-" in raw or "_" in raw) else None
            return base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=altchars, validate=True)
        except (binascii.Error, ValueError):
            raise APIError(400, f"{param}: the image data is not valid base64", param=param) from None

    def _data_url(self, url: str, param: str) -> bytes:
        head, comma, body = url.partition(",")
        if not comma or not head.endswith(";base64"):
            raise APIError(400, f"{param}: a data: URL must be data:<type>;base64,<data>", param=param)
        return self.base64(body, param)

    def _allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)

    async def _fetch(self, url: str, param: str) -> bytes:
        host = urllib.parse.urlsplit(url).hostname or ""
        if not self._allowed(host):
            raise APIError(
                400,
                f"{param}: fetching images from {host or url[:60]!r} is not allowed (--allowed-image-domains)",
                param=param,
            )
        try:
            async with (
                httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client,
                client.stream("GET", url) as response,
            ):
                if response.status_code != 200:
                    raise APIError(400, f"{param}: fetching the image answered {response.status_code}", param=param)
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > self.max_bytes:
                        raise APIError(
                            413, f"{param}: the image is over the limit of {self.max_bytes} bytes", param=param
                        )
                return bytes(data)
        except httpx.TimeoutException:
            raise APIError(400, f"{param}: fetching the image took over {self.timeout_s:g}s", param=param) from None
        except httpx.HTTPError as e:
            raise APIError(400, f"{param}: the image could not be fetched: {type(e).__name__}", param=param) from None
