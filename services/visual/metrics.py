"""The visual service's Prometheus series (docs/metrics.md, "visual"), and its heartbeat's figures.

A cache hit is an image of a request whose embeddings Redis held already (sent before within
their time-to-live, or earlier in the same batch); a miss is one the tower encoded.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.metrics import LoopHistogram

PREFIX = "lightstream_visual_"
ENCODE_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class VisualMetrics:
    """Counters the service loop bumps; only that thread writes them."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.requests = 0  # requests passed on to the router
        self.failed = 0  # requests ended here (an image that could not be encoded)
        self.cache_hits = 0
        self.cache_misses = 0
        self.batches = 0  # batches through the tower
        self.images = 0  # images through the tower
        self.tower_seconds = 0.0  # in the tower and projector, the rows back on the host (no preparing)
        self.encode_seconds = LoopHistogram(ENCODE_SECONDS_BUCKETS)

    def on_encode(self, seconds: float, images: int, tower_seconds: float) -> None:
        self.batches += 1
        self.images += images
        self.tower_seconds += tower_seconds
        self.encode_seconds.observe(seconds)

    def heartbeat(self) -> dict[str, float]:
        return {
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "requests": self.requests,
            "failed": self.failed,
            "batches": self.batches,
            "images": self.images,
            "tower_seconds": self.tower_seconds,
            "encode_seconds": self.encode_seconds.sum,
        }


class VisualCollector(Collector):
    def __init__(self, metrics: VisualMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        labels = [m.replica]
        for name, text, value in (
            ("requests", "Requests with images passed on to the router", m.requests),
            ("failed_requests", "Requests ended here: an image could not be encoded", m.failed),
            ("cache_hits", "Images of requests whose embeddings Redis held already", m.cache_hits),
            ("cache_misses", "Images of requests the tower encoded", m.cache_misses),
            ("batches", "Batches of images through the tower", m.batches),
            ("images", "Images through the tower", m.images),
            (
                "tower_seconds",
                "Seconds in the tower and projector (rows back on the host; no preparing)",
                m.tower_seconds,
            ),
        ):
            family = CounterMetricFamily(PREFIX + name, text, labels=["replica"])
            family.add_metric(labels, value)
            yield family
        yield m.encode_seconds.family(
            PREFIX + "encode_seconds",
            "Time to encode one batch of images (prepare, tower, projector)",
            ["replica"],
            labels,
        )
