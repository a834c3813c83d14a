"""The router's figures: a snapshot the loop takes after each round, read by the log line,
the heartbeat and Prometheus (series documented in docs/metrics.md, "router").

The loop builds a new immutable snapshot and swaps it in, so the heartbeat thread and
the metrics server read consistent figures without a lock and without touching the
router's state while the loop changes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "lightstream_router_"


@dataclass(frozen=True)
class GroupFigures:
    name: str
    capacity_tokens: int
    used_tokens: int  # KV tokens in use by its last status (the cache's evictable ones count as free)
    running: int  # requests placed there: running, admitted and not started, or paused
    paused: int
    cached_tokens: int = 0  # tokens in its prompt cache's tree by its last status (evictable + locked)
    index_tokens: int = 0  # tokens in the router's index of what that cache holds

    @property
    def usage(self) -> float:
        return self.used_tokens / self.capacity_tokens if self.capacity_tokens else 1.0


@dataclass(frozen=True)
class RouterFigures:
    waiting: int = 0
    running: int = 0
    paused: int = 0
    max_waiting: int = 0  # the queue bound, so a front end can refuse before sending
    oldest_wait_s: float = 0.0  # how long the head of the queue has waited
    groups: tuple[GroupFigures, ...] = ()
    admitted: dict[str, int] = field(default_factory=dict)  # group -> requests placed there, ever
    routed: dict[tuple[str, bool], int] = field(default_factory=dict)  # (group, prefix hit) -> requests placed
    rejected: dict[str, int] = field(default_factory=dict)  # error kind -> requests rejected
    requeued: int = 0
    failed: int = 0
    aborted: int = 0

    def info(self) -> dict[str, float]:
        """Flat figures for the heartbeat and the periodic log line."""
        out: dict[str, float] = {
            "waiting": self.waiting,
            "running": self.running,
            "paused": self.paused,
            "max_waiting": self.max_waiting,
            "groups": len(self.groups),
            "admitted_total": sum(self.admitted.values()),
            "rejected_total": sum(self.rejected.values()),
            "requeued_total": self.requeued,
            "failed_total": self.failed,
            "aborted_total": self.aborted,
        }
        for g in self.groups:
            out[f"group_{g.name}_used_fraction"] = round(g.usage, 4)
        return out


class RouterCollector(Collector):
    """Prometheus series built at scrape time from the latest snapshot."""

    def __init__(self, figures: Callable[[], RouterFigures]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        f = self.figures()
        yield _gauge("waiting_requests", "Requests in the router's queue", f.waiting)
        yield _gauge("running_requests", "Requests placed on worker groups and not ended", f.running)
        yield _gauge("paused_requests", "Placed requests that their worker paused (preempted)", f.paused)
        yield _gauge("max_waiting_requests", "The queue bound; past it requests are rejected", f.max_waiting)
        yield _gauge("oldest_wait_seconds", "How long the head of the queue has waited", f.oldest_wait_s)
        yield _gauge("worker_groups", "Worker groups alive", len(f.groups))
        per_group = [
            ("group_capacity_tokens", "KV pool size of each worker group", lambda g: g.capacity_tokens),
            ("group_used_tokens", "KV tokens in use in each worker group", lambda g: g.used_tokens),
            ("group_token_usage", "Fraction of each worker group's KV pool in use", lambda g: g.usage),
            ("group_running_requests", "Requests placed on each worker group", lambda g: g.running),
            ("group_paused_requests", "Paused requests in each worker group", lambda g: g.paused),
            ("group_cached_tokens", "Tokens in each worker group's prompt cache", lambda g: g.cached_tokens),
            ("group_index_tokens", "Tokens in the router's index of each group's cache", lambda g: g.index_tokens),
        ]
        for name, doc, value in per_group:
            m = GaugeMetricFamily(PREFIX + name, doc, labels=["group"])
            for g in f.groups:
                m.add_metric([g.name], value(g))
            yield m
        admitted = CounterMetricFamily(PREFIX + "admitted", "Requests admitted, by worker group", labels=["group"])
        for name, n in sorted(f.admitted.items()):
            admitted.add_metric([name], n)
        yield admitted
        routed = CounterMetricFamily(
            PREFIX + "routed",
            "Requests placed, by worker group and whether its cache had their prefix",
            labels=["group", "matched"],
        )
        for (name, hit), n in sorted(f.routed.items()):
            routed.add_metric([name, "true" if hit else "false"], n)
        yield routed
        rejected = CounterMetricFamily(PREFIX + "rejected", "Requests the router ended unadmitted", labels=["reason"])
        for kind, n in sorted(f.rejected.items()):
            rejected.add_metric([kind], n)
        yield rejected
        yield _counter("requeued", "Requests of a lost worker group handed over to go on elsewhere", f.requeued)
        yield _counter("failed", "Requests ended with an error because their worker group was lost", f.failed)
        yield _counter("aborted", "Aborts handled (client gone, stop string, deadline)", f.aborted)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)
