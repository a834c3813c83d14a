"""The visual service loop: receive requests with images, encode the images Redis lacks in
batches through the tower, store their embeddings, pass the requests on to the router.

Every replica reads the one visual stream through one consumer group, so a request goes to
whichever replica is free, and a replica that dies leaves its entries pending for the others
(or its successor) to claim. An entry is acknowledged with the request's hand-on to the router,
in one transaction, after its embeddings are stored: a request reaches the router only when
every one of its images is in Redis. An image that cannot be encoded ends its requests with an
explicit error, sent to their detokenizer shards as the router's errors are.
"""

from __future__ import annotations

import logging
import time

from services.visual.codec import to_message
from services.visual.families.interface import Pixels, VisionTower
from services.visual.image_prep import open_rgb
from services.visual.metrics import VisualMetrics
from shared.busy_poll import BusyPoll
from shared.image_store import ImageStore
from shared.messages import ERR_INVALID, FINISH_ERROR, GenerateReq, ImageData, TokenBatch, TokenItem, VisualReq
from shared.redis_link import RedisLink
from shared.redis_streams import Entry, StreamReader, StreamWriter
from shared.streams import GROUP_VISUAL, StreamNames

log = logging.getLogger(__name__)


class VisualService:
    def __init__(
        self,
        tower: VisionTower,
        link: RedisLink,
        names: StreamNames,
        replica: str,
        store: ImageStore,
        max_batch_images: int,
        maxlen: int,
        metrics: VisualMetrics | None = None,
        poll: BusyPoll | None = None,
    ) -> None:
        self.tower = tower
        self.link = link
        self.names = names
        self.store = store
        self.max_batch_images = max_batch_images
        self.metrics = metrics or VisualMetrics(replica)
        self.poll = poll or BusyPoll(0.0)
        self.reader = StreamReader(link, names.visual, GROUP_VISUAL, consumer=replica)
        self.writer = StreamWriter(link, maxlen)

    def run(self) -> None:
        log.info("visual replica reading %s", self.names.visual)
        while not self.link.stop.is_set():
            entries = self.poll.read(self.reader, count=self.max_batch_images, wait_ms=500)
            self.poll.note(bool(entries))
            if entries:
                self.handle(entries)

    def handle(self, entries: list[Entry]) -> None:
        now = time.time()
        reqs: list[VisualReq] = []
        for entry in entries:
            if not isinstance(entry.msg, VisualReq):
                log.error("unexpected %s on the visual stream", type(entry.msg).__name__)
            elif entry.msg.req.deadline < now:  # its front end has ended it already
                log.warning("dropping a request past its deadline", extra={"rid": entry.msg.req.rid})
            else:
                reqs.append(entry.msg)
        failed = self._ensure_encoded(reqs)
        out: list[tuple[str, object]] = []
        for r in reqs:
            why = next((failed[d.hash] for d in r.images if d.hash in failed), None)
            if why is None:
                out.append((self.names.router, r.req))
                self.metrics.requests += 1
            else:
                self.metrics.failed += 1
                log.warning("failing: %s", why, extra={"rid": r.req.rid})
                out.append((self.names.detok(r.req.detok), TokenBatch("visual", [_failed(r.req, why)])))
        self.writer.send_many(out, acks=entries)

    def _ensure_encoded(self, reqs: list[VisualReq]) -> dict[str, str]:
        """Encode and store every image of reqs that Redis lacks; -> hash: why, for those that
        could not be encoded."""
        images: dict[str, ImageData] = {d.hash: d for r in reqs for d in r.images}
        hashes = list(images)
        stored = dict(zip(hashes, self.store.keep(hashes), strict=True))
        seen: set[str] = set()
        for r in reqs:  # per request's image: a hit when Redis or an earlier request of the batch has it
            for d in r.images:
                if stored[d.hash] or d.hash in seen:
                    self.metrics.cache_hits += 1
                else:
                    self.metrics.cache_misses += 1
                    seen.add(d.hash)
        missing = [images[h] for h in hashes if not stored[h]]
        failed: dict[str, str] = {}
        for start in range(0, len(missing), self.max_batch_images):
            failed |= self._encode_batch(missing[start : start + self.max_batch_images])
        return failed

    def _encode_batch(self, batch: list[ImageData]) -> dict[str, str]:
        started = time.perf_counter()
        prepared: list[tuple[str, Pixels]] = []
        failed: dict[str, str] = {}
        for d in batch:
            try:
                prepared.append((d.hash, self.tower.prepare(open_rgb(d.data))))
            except Exception as e:  # the front end checked it; a decoder that disagrees ends its requests
                failed[d.hash] = f"the image could not be prepared: {type(e).__name__}: {str(e)[:200]}"
        tower_s = 0.0
        if prepared:
            tower_started = time.perf_counter()
            rows = self.tower.encode([p for _, p in prepared])
            messages = {h: to_message(r) for (h, _), r in zip(prepared, rows, strict=True)}  # on the host: synced
            tower_s = time.perf_counter() - tower_started
            self.store.put(messages)
        self.metrics.on_encode(time.perf_counter() - started, len(prepared), tower_s)
        return failed


def _failed(req: GenerateReq, why: str) -> TokenItem:
    """The item that ends a request whose images could not be encoded."""
    return TokenItem(
        req.rid,
        [],
        finish_reason=FINISH_ERROR,
        error=why,
        error_kind=ERR_INVALID,
        prompt_tokens=req.prompt_len,
        handovers=req.handovers,
    )
