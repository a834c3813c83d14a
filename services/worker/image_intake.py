"""A request's images as the worker takes it in: each image's embeddings read from Redis (the
visual service stored them before the request reached the router) and put on the device, as the
request's ImageSpans. An image whose embeddings are gone (their time-to-live ran out while the
request queued) or do not fit its positions ends the request with an explicit error."""

from __future__ import annotations

import torch

from services.visual.codec import from_message
from services.worker.request import ImageSpan
from shared.image_store import ImageStore
from shared.messages import GenerateReq


class ImageIntake:
    def __init__(
        self, store: ImageStore, hidden_size: int, dtype: torch.dtype, device: torch.device, grids: bool = False
    ) -> None:
        """grids: the model's positions follow each image's grid (M-RoPE), which every image must have."""
        self.store = store
        self.grids = grids
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.device = device

    def spans(self, reqs: list[GenerateReq]) -> dict[str, list[ImageSpan] | str]:
        """For each request with images (by rid): its spans, or why it cannot run. One round trip."""
        hashes = sorted({i.hash for r in reqs for i in r.images})
        stored = self.store.get(hashes)
        rows = {h: from_message(e) for h, e in stored.items()}
        out: dict[str, list[ImageSpan] | str] = {}
        for r in reqs:
            if r.images:
                out[r.rid] = self._spans(r, rows)
        return out

    def _spans(self, req: GenerateReq, rows: dict[str, torch.Tensor]) -> list[ImageSpan] | str:
        spans = []
        for image in req.images:
            t = rows.get(image.hash)
            if t is None:
                return f"the embeddings of image {image.hash[:12]} expired before the request started"
            if tuple(t.shape) != (image.length, self.hidden_size):
                return f"image {image.hash[:12]}: embeddings {tuple(t.shape)} for {image.length} positions"
            if self.grids and not image.grid:
                return f"image {image.hash[:12]}: no grid for the model's M-RoPE positions"
            grid = tuple(image.grid)
            spans.append(ImageSpan(image.offset, t.to(self.device, self.dtype), grid))
        return spans
