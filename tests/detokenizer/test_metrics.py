"""The detokenizer's figures, counted per batch of entries handled."""

from __future__ import annotations

from services.detokenizer.metrics import DetokMetrics
from shared.messages import DetokRegister, TextItem, TokenBatch, TokenItem
from shared.redis_streams import Entry


def test_messages_items_and_stop_ends_are_counted() -> None:
    m = DetokMetrics("s0")
    entries = [
        Entry("st", "g", b"1-0", DetokRegister("a", "f", 3, [], True, 0.0)),
        Entry("st", "g", b"2-0", TokenBatch("worker:0", [TokenItem("a", [1]), TokenItem("b", [2])])),
    ]
    texts = {"f1": [TextItem("a", "x"), TextItem("b", "y")], "f2": [TextItem("c", "z")]}
    m.on_handle(entries, texts, stop_ends=1, seconds=0.0004)
    m.on_handle([], {}, stop_ends=0, seconds=0.5)  # an empty read counts for nothing
    assert m.messages == {"register": 1, "token_batch": 1, "other": 0}
    assert (m.token_items, m.text_items, m.text_batches, m.stop_ends) == (2, 3, 2, 1)
    assert m.decode_seconds.sum == 0.0004 and sum(m.decode_seconds.counts) == 1
