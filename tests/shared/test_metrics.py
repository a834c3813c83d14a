"""LoopHistogram: the hot-loop histogram's buckets as Prometheus reads them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from shared.metrics import LoopHistogram


def test_buckets_are_cumulative_and_inclusive() -> None:
    h = LoopHistogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.05, 3.0):
        h.observe(v)

    class One(Collector):
        def collect(self):
            yield h.family("x_seconds", "doc", ["group"], ["g"])

    registry = CollectorRegistry()
    registry.register(One())
    text = generate_latest(registry).decode()
    for line in (
        'x_seconds_bucket{group="g",le="0.001"} 2.0',  # le is <=
        'x_seconds_bucket{group="g",le="0.01"} 2.0',
        'x_seconds_bucket{group="g",le="0.1"} 3.0',
        'x_seconds_bucket{group="g",le="+Inf"} 4.0',
        'x_seconds_count{group="g"} 4.0',
        'x_seconds_sum{group="g"} 3.0515',
    ):
        assert line in text, text


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError):
        LoopHistogram((1, 1, 2))
