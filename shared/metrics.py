"""Prometheus metrics for the services that have no HTTP server of their own.

A service builds a CollectorRegistry with its collectors and calls ``serve_metrics``
with ``CommonConfig.metrics_port``: a daemon thread then answers ``GET /metrics`` on that
port. A registry per service (not prometheus_client's global one) keeps the series of
several services, or of several instances in one test process, apart.

Every series carries a ``model_name`` label (``ModelLabel``): one Prometheus scraping several
stacks, or a stack serving several models, tells their series apart by it.

``LoopHistogram`` is for hot loops (the worker's step loop): an observation is one bisect
and two additions, with no lock, and the Prometheus family is built at scrape time on
the metrics thread. prometheus_client's Histogram takes a lock and walks every bucket on
each observation; a scrape that reads counts mid-update is off by one observation at most.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class ModelLabel(Collector):
    """Another registry's series, each with a model_name label added."""

    def __init__(self, inner: CollectorRegistry, model_name: str) -> None:
        self.inner = inner
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        for fam in self.inner.collect():
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                out.add_sample(s.name, {**s.labels, "model_name": self.model_name}, s.value, s.timestamp, s.exemplar)
            yield out


def labelled(inner: CollectorRegistry, model_name: str) -> CollectorRegistry:
    """A registry that exposes inner's series with the model_name label."""
    outer = CollectorRegistry()
    outer.register(ModelLabel(inner, model_name))
    return outer


def serve_metrics(port: int, registry: CollectorRegistry, addr: str = "0.0.0.0") -> bool:
    """Serve ``registry`` at http://addr:port/metrics when port is non-zero; -> whether it serves."""
    if not port:
        return False
    start_http_server(port, addr=addr, registry=registry)
    log.info("metrics at http://%s:%d/metrics", addr, port)
    return True


class LoopHistogram:
    """Counts per bucket, updated by one thread, read by the scrape thread."""

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must be increasing and distinct, got {bounds}")
        self.bounds = tuple(bounds)  # upper bounds; +Inf is implied
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(
        self, name: str, doc: str, labels: Sequence[str] = (), values: Sequence[str] = ()
    ) -> HistogramMetricFamily:
        counts = list(self.counts)  # one copy, so the buckets agree with each other
        buckets, total = [], 0
        for bound, n in zip([*self.bounds, float("inf")], counts, strict=True):
            total += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), total))
        fam = HistogramMetricFamily(name, doc, labels=list(labels))
        fam.add_metric(list(values), buckets, self.sum)
        return fam
