"""A request's images as the worker takes it in, against a real redis-server: the stored
embeddings become its spans on the device (with their grids, for M-RoPE); embeddings gone, of the
wrong shape for the positions, or without the grid an M-RoPE model needs, are why it cannot run."""

from __future__ import annotations

import torch

from services.visual.codec import to_message
from services.worker.image_intake import ImageIntake
from shared.image_store import ImageStore
from shared.messages import GenerateReq, ImageRef, SamplingParams
from shared.redis_link import RedisLink
from shared.streams import StreamNames

NAMES = StreamNames("w")
H1, H2, H3 = "a" * 64, "b" * 64, "c" * 64


def _req(rid: str, refs: list[ImageRef]) -> GenerateReq:
    return GenerateReq(rid, "f", "d", [0] * 12, SamplingParams(), 0.0, 0.0, images=refs)


def test_stored_embeddings_become_spans_and_missing_or_misfit_ones_say_why(redis_url: str) -> None:
    link = RedisLink(redis_url)
    rows = torch.randn(3, 8)
    ImageStore(link, NAMES, 60.0).put({H1: to_message(rows), H3: to_message(torch.randn(2, 8))})
    intake = ImageIntake(ImageStore(link, NAMES), hidden_size=8, dtype=torch.bfloat16, device=torch.device("cpu"))
    reqs = [
        _req("ok", [ImageRef(H1, 1, 3), ImageRef(H1, 6, 3)]),  # one image twice
        _req("gone", [ImageRef(H1, 1, 3), ImageRef(H2, 6, 3)]),
        _req("misfit", [ImageRef(H3, 1, 3)]),
        _req("text", []),
    ]
    got = intake.spans(reqs)
    assert set(got) == {"ok", "gone", "misfit"}  # a request without images needs nothing
    ok = got["ok"]
    assert [(s.offset, s.end) for s in ok] == [(1, 4), (6, 9)]
    assert ok[0].rows.dtype == torch.bfloat16 and torch.equal(ok[0].rows, rows.to(torch.bfloat16))
    assert "expired" in got["gone"] and "(2, 8) for 3 positions" in got["misfit"]


def test_an_m_rope_model_takes_each_images_grid_and_needs_one(redis_url: str) -> None:
    link = RedisLink(redis_url)
    ImageStore(link, NAMES, 60.0).put({H1: to_message(torch.randn(6, 8))})
    intake = ImageIntake(ImageStore(link, NAMES), 8, torch.float32, torch.device("cpu"), grids=True)
    got = intake.spans([_req("grid", [ImageRef(H1, 2, 6, [1, 2, 3])]), _req("none", [ImageRef(H1, 2, 6)])])
    assert got["grid"][0].grid == (1, 2, 3) and "no grid" in got["none"]
