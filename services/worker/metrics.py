"""The worker's Prometheus series (docs/metrics.md, "worker"): what the step loop counts,
and what a scrape reads from the engine.

The step loop is the hot path, so it pays for one call per step, ``on_step``: three
bisects and a few integer additions, no lock, no allocation (ends are counted only on
the steps that report one). Request counts by state, KV usage and preemptions cost the
loop nothing: the collector reads them from the engine at scrape time, on the metrics
server's thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.messages import FINISH_REASONS
from shared.metrics import LoopHistogram

if TYPE_CHECKING:
    from services.worker.engine import Engine, StepOutput

PREFIX = "lightstream_worker_"

# a step: from a fraction of a millisecond (a small decode on a GPU) to seconds (a long CPU prefill)
STEP_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.0, 5.0)
STEP_TOKENS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
BATCH_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class WorkerMetrics:
    """Counters the step loop bumps; only that thread writes them."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.steps = 0
        self.step_seconds = LoopHistogram(STEP_SECONDS_BUCKETS)
        self.step_tokens = LoopHistogram(STEP_TOKENS_BUCKETS)
        self.decode_batch = LoopHistogram(BATCH_BUCKETS)
        self.prefill_tokens = 0
        self.decode_tokens = 0
        # every reason present from the start, so the loop never grows the dict a scrape reads
        self.finished: dict[str, int] = dict.fromkeys((r for r in FINISH_REASONS if r), 0)

    def on_step(self, out: StepOutput, seconds: float) -> None:
        self.steps += 1
        self.step_seconds.observe(seconds)
        self.step_tokens.observe(out.num_tokens)
        self.decode_batch.observe(out.num_decodes)
        self.decode_tokens += out.num_decodes
        self.prefill_tokens += out.num_tokens - out.num_decodes
        if out.changed:  # only a step that ended a request (or began one's output) has ends to count
            for _, item in out.items:
                if item.finish_reason:
                    self.finished[item.finish_reason] = self.finished.get(item.finish_reason, 0) + 1


class WorkerCollector(Collector):
    """Prometheus series built at scrape time from the counters and the engine's state."""

    def __init__(self, metrics: WorkerMetrics, engine: Engine) -> None:
        self.metrics = metrics
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        m, sched, kv = self.metrics, self.engine.scheduler, self.engine.kv
        group = [m.group]
        yield _counter("steps", "Steps of the step loop", group, m.steps)
        yield m.step_seconds.family(PREFIX + "step_seconds", "Time of one step", ["group"], group)
        yield m.step_tokens.family(PREFIX + "step_tokens", "Tokens the model ran in one step", ["group"], group)
        yield m.decode_batch.family(PREFIX + "decode_batch_size", "Requests decoded in one step", ["group"], group)
        yield _counter("prefill_tokens", "Prompt (and recomputed) tokens run", group, m.prefill_tokens)
        yield _counter("decode_tokens", "Tokens decoded, one per request per step", group, m.decode_tokens)
        capacity, free = kv.capacity, kv.free_tokens
        yield _gauge("kv_capacity_tokens", "KV pool size in tokens", group, capacity)
        yield _gauge("kv_used_tokens", "KV tokens in use", group, capacity - free)
        yield _gauge(
            "kv_usage", "Fraction of the KV pool in use", group, (capacity - free) / capacity if capacity else 0
        )
        yield from _prefix_cache(kv, group)
        running = len(sched.running)
        waiting = list(sched.waiting)  # one copy in C: the step loop may change the queue meanwhile
        paused = sum(1 for r in waiting if r.output_len > 0)
        yield _gauge("running_requests", "Requests holding KV", group, running)
        yield _gauge("waiting_requests", "Admitted requests not started yet", group, len(waiting) - paused)
        yield _gauge("paused_requests", "Requests paused (preempted) to free KV, to resume", group, paused)
        yield _counter("preemptions", "Requests paused because the pool was full", group, sched.num_paused_total)
        held = sched.num_held_back_total
        yield _counter("prefill_held_back", "Steps a request waited for a prefix another was prefilling", group, held)
        ended = CounterMetricFamily(PREFIX + "finished", "Requests ended, by finish reason", labels=["group", "reason"])
        for reason, n in sorted(m.finished.items()):
            ended.add_metric([m.group, reason], n)
        yield ended


def _prefix_cache(kv, group: list[str]) -> Iterator[Metric]:
    """The prompt cache's series (vLLM's names for queries and hits, counted in tokens)."""
    if kv.cache is None:
        return
    st = kv.cache.stats
    yield _counter(
        "prefix_cache_queries", "Prompt tokens looked up in the prompt cache as requests started", group, st.queries
    )
    yield _counter("prefix_cache_hits", "Of those, tokens found cached (their prefill skipped)", group, st.hits)
    yield _counter("prefix_cache_evicted_tokens", "Cached tokens evicted to make room", group, st.evicted)
    held = kv.evictable_tokens + kv.cache_locked_tokens
    yield _gauge("prefix_cache_tokens", "KV tokens the prompt cache's tree holds", group, held)
    yield _gauge("prefix_cache_evictable_tokens", "Cached tokens no running request holds", group, kv.evictable_tokens)


def _gauge(name: str, doc: str, labels: list[str], value: float) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(PREFIX + name, doc, labels=["group"])
    fam.add_metric(labels, value)
    return fam


def _counter(name: str, doc: str, labels: list[str], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(PREFIX + name, doc, labels=["group"])
    fam.add_metric(labels, value)
    return fam
