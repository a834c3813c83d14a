"""The visual service's loop against a real redis-server and the tiny LLaVA's tower: requests pass
on to the router only with their images' embeddings stored, each distinct image is encoded once
(within a batch and across batches), an image that cannot be prepared ends its requests with an
error to their detokenizer shards, and a request past its deadline is dropped."""

from __future__ import annotations

import time

import torch

from services.visual.codec import from_message
from services.visual.families import load_tower
from services.visual.service import VisualService
from shared.image_store import ImageStore
from shared.messages import FINISH_ERROR, GenerateReq, ImageData, ImageRef, SamplingParams, TokenBatch, VisualReq
from shared.model_config import ModelConfig
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import StreamNames
from tests import vision_cases as vc

NAMES = StreamNames("v")


def _req(rid: str, images: list[bytes], deadline: float | None = None) -> VisualReq:
    hashes = [vc.content_hash(d) for d in images]
    refs = [ImageRef(h, 1 + 16 * i, 16) for i, h in enumerate(hashes)]
    ids = [1] + [-5] * (16 * len(images)) + [2]
    gen = GenerateReq(rid, "f", "d0", ids, SamplingParams(), time.time(), deadline or time.time() + 60, images=refs)
    return VisualReq(gen, [ImageData(h, d) for h, d in dict(zip(hashes, images, strict=True)).items()])


def _service(tiny_llava: str, redis_url: str) -> tuple[VisualService, RedisLink]:
    cfg = ModelConfig.from_dir(tiny_llava)
    tower = load_tower(tiny_llava, cfg.vision, torch.float32, torch.device("cpu"))
    link = RedisLink(redis_url)
    return VisualService(tower, link, NAMES, "v0", ImageStore(link, NAMES, 60.0), 4, 1000), link


def _drain(service: VisualService, link: RedisLink) -> tuple[list, list]:
    """Run the loop's step on what the visual stream holds -> (router messages, detok messages)."""
    service.handle(service.reader.read(count=64))
    router = StreamReader(link, NAMES.router, "r", "r0").read(count=64)
    detok = StreamReader(link, NAMES.detok("d0"), "d", "d0").read(count=64)
    return [e.msg for e in router], [e.msg for e in detok]


def test_images_are_stored_once_before_their_requests_go_on(tiny_llava: str, redis_url: str) -> None:
    service, link = _service(tiny_llava, redis_url)
    a, b = vc.png(vc.image(1, 40, 30)), vc.png(vc.image(2, 30, 50))
    writer = StreamWriter(link)
    for msg in (_req("r1", [a, b]), _req("r2", [b]), _req("r3", [a], deadline=time.time() - 1)):
        writer.send(NAMES.visual, msg)
    router, detok = _drain(service, link)
    assert [m.rid for m in router] == ["r1", "r2"] and detok == []  # r3 was past its deadline
    m = service.metrics
    assert (m.cache_misses, m.cache_hits, m.requests) == (2, 1, 2)  # b twice in one batch: encoded once
    stored = ImageStore(link, NAMES).get([vc.content_hash(a), vc.content_hash(b)])
    assert [tuple(from_message(e).shape) for e in stored.values()] == [(16, 64), (16, 64)]
    writer.send(NAMES.visual, _req("r4", [a]))  # a later batch: Redis has it
    router, _ = _drain(service, link)
    assert [r.rid for r in router] == ["r4"] and (m.cache_misses, m.cache_hits) == (2, 2)


def test_an_image_that_cannot_be_prepared_ends_its_request(tiny_llava: str, redis_url: str) -> None:
    service, link = _service(tiny_llava, redis_url)
    good, broken = vc.png(vc.image(3, 20, 20)), vc.png(vc.image(4, 20, 20))[:40]
    StreamWriter(link).send(NAMES.visual, _req("bad", [good, broken]))
    StreamWriter(link).send(NAMES.visual, _req("ok", [good]))
    router, detok = _drain(service, link)
    assert [r.rid for r in router] == ["ok"] and service.metrics.failed == 1
    (batch,) = detok
    assert isinstance(batch, TokenBatch) and batch.items[0].rid == "bad"
    assert batch.items[0].finish_reason == FINISH_ERROR and "could not be prepared" in batch.items[0].error
    assert service.reader.pending_count() == 0  # every entry acknowledged with its side effect
