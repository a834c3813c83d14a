"""The worker's figures: what one call per step counts, and what a scrape reads from the engine."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.worker.engine import StepOutput
from services.worker.memory.prompt_cache import CacheStats
from services.worker.metrics import WorkerCollector, WorkerMetrics
from shared.messages import TokenItem


def _scrape(m: WorkerMetrics, engine: object) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(WorkerCollector(m, engine))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_steps_tokens_and_ends_are_counted() -> None:
    m = WorkerMetrics("g0")
    m.on_step(StepOutput([], num_tokens=40, num_decodes=0, changed=False), 0.010)  # a prefill
    items = [("d", TokenItem("a", [5])), ("d", TokenItem("b", [6], finish_reason="length"))]
    m.on_step(StepOutput(items, num_tokens=2, num_decodes=2, changed=True), 0.002)
    items = [("d", TokenItem("c", [], finish_reason="abort"))]
    m.on_step(StepOutput(items, num_tokens=1, num_decodes=1, changed=True), 0.001)
    assert m.steps == 3 and m.prefill_tokens == 40 and m.decode_tokens == 3
    assert m.finished == {"stop": 0, "length": 1, "abort": 1, "error": 0}

    waiting = deque([SimpleNamespace(output_len=0), SimpleNamespace(output_len=3)])  # one new, one paused
    engine = SimpleNamespace(
        scheduler=SimpleNamespace(running=[object()] * 2, waiting=waiting, num_paused_total=4, num_held_back_total=6),
        kv=SimpleNamespace(
            capacity=100,
            free_tokens=75,
            evictable_tokens=10,
            cache_locked_tokens=5,
            cache=SimpleNamespace(stats=CacheStats(queries=50, hits=30, evicted=7)),
        ),
    )
    got = _scrape(m, engine)
    g = (("group", "g0"),)
    assert got[("lightstream_worker_steps_total", g)] == 3
    assert got[("lightstream_worker_step_seconds_count", g)] == 3
    assert got[("lightstream_worker_step_tokens_sum", g)] == 43
    assert got[("lightstream_worker_decode_batch_size_bucket", (("group", "g0"), ("le", "0.0")))] == 1
    assert got[("lightstream_worker_kv_used_tokens", g)] == 25 and got[("lightstream_worker_kv_usage", g)] == 0.25
    assert got[("lightstream_worker_running_requests", g)] == 2
    assert got[("lightstream_worker_waiting_requests", g)] == 1 and got[("lightstream_worker_paused_requests", g)] == 1
    assert got[("lightstream_worker_preemptions_total", g)] == 4
    assert got[("lightstream_worker_prefill_held_back_total", g)] == 6
    assert got[("lightstream_worker_prefix_cache_queries_total", g)] == 50
    assert got[("lightstream_worker_prefix_cache_hits_total", g)] == 30
    assert got[("lightstream_worker_prefix_cache_evicted_tokens_total", g)] == 7
    assert got[("lightstream_worker_prefix_cache_tokens", g)] == 15
    assert got[("lightstream_worker_prefix_cache_evictable_tokens", g)] == 10
    assert got[("lightstream_worker_finished_total", (("group", "g0"), ("reason", "abort")))] == 1
