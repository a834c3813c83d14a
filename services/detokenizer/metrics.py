"""The detokenizer's Prometheus series (docs/metrics.md, "detokenizer").

The loop reports each batch of entries it handled with one call; open sessions are
read from the service at scrape time, on the metrics server's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.messages import DetokRegister, TextItem, TokenBatch
from shared.metrics import LoopHistogram
from shared.redis_streams import Entry

PREFIX = "lightstream_detokenizer_"

DECODE_SECONDS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
MESSAGE_TYPES = ("register", "token_batch", "other")


class DetokMetrics:
    """Counters the service loop bumps; only that thread writes them."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        self.messages: dict[str, int] = dict.fromkeys(MESSAGE_TYPES, 0)
        self.token_items = 0
        self.text_items = 0
        self.text_batches = 0
        self.stop_ends = 0
        self.decode_seconds = LoopHistogram(DECODE_SECONDS_BUCKETS)

    def on_handle(self, entries: list[Entry], texts: dict[str, list[TextItem]], stop_ends: int, seconds: float) -> None:
        """One batch of entries handled: texts are the items sent to each front end."""
        if not entries:
            return
        for e in entries:
            if isinstance(e.msg, TokenBatch):
                self.messages["token_batch"] += 1
                self.token_items += len(e.msg.items)
            elif isinstance(e.msg, DetokRegister):
                self.messages["register"] += 1
            else:
                self.messages["other"] += 1
        self.text_batches += len(texts)
        self.text_items += sum(len(items) for items in texts.values())
        self.stop_ends += stop_ends
        self.decode_seconds.observe(seconds)


class DetokCollector(Collector):
    def __init__(self, metrics: DetokMetrics, sessions: Callable[[], int]) -> None:
        self.metrics = metrics
        self.sessions = sessions

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        shard = [m.shard]
        messages = CounterMetricFamily(PREFIX + "messages", "Messages read, by type", labels=["shard", "type"])
        for kind, n in m.messages.items():
            messages.add_metric([m.shard, kind], n)
        yield messages
        yield _counter(
            "token_items", "Token items read (one request's tokens of one worker step)", shard, m.token_items
        )
        yield _counter("text_items", "Text items sent to front ends", shard, m.text_items)
        yield _counter(
            "text_batches", "TextBatch messages sent (one per front end per batch read)", shard, m.text_batches
        )
        yield _counter("stop_string_ends", "Requests this shard ended on a stop string", shard, m.stop_ends)
        sessions = GaugeMetricFamily(PREFIX + "sessions", "Requests registered and not ended", labels=["shard"])
        sessions.add_metric(shard, self.sessions())
        yield sessions
        yield m.decode_seconds.family(
            PREFIX + "decode_seconds", "Time to decode one batch of entries read, sending excluded", ["shard"], shard
        )


def _counter(name: str, doc: str, labels: list[str], value: float) -> CounterMetricFamily:
    fam = CounterMetricFamily(PREFIX + name, doc, labels=["shard"])
    fam.add_metric(labels, value)
    return fam
