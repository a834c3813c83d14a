"""A detokenizer shard's drain against a real redis-server: it serves its open requests to their
end and then stops; those still open at the drain timeout end with an explicit error sent to
their front end, and are aborted at the router."""

from __future__ import annotations

import threading
import time
import uuid

from services.detokenizer.service import DetokenizerService
from shared.drain import Drain
from shared.messages import FINISH_ERROR, AbortReq, DetokRegister, TextBatch, TokenBatch, TokenItem
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import StreamNames


class _Letters:
    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def _service(redis_url: str, timeout_s: float) -> tuple[DetokenizerService, threading.Event, StreamWriter]:
    link = RedisLink(redis_url)
    names = StreamNames("t" + uuid.uuid4().hex[:8])
    requested = threading.Event()
    service = DetokenizerService(link, names, "d0", _Letters(), 1000, drain=Drain(requested, timeout_s, 0.2))
    writer = StreamWriter(link)
    writer.send(names.detok("d0"), DetokRegister("r1", "f0", 3, [], True, time.time() + 60))
    return service, requested, writer


def _texts(service: DetokenizerService) -> list:
    front = StreamReader(service.link, service.names.front("f0"), "front", "c").read(count=100, block_ms=100)
    return [i for e in front if isinstance(e.msg, TextBatch) for i in e.msg.items]


def test_a_drain_serves_the_open_request_to_its_end_then_stops(redis_url: str) -> None:
    service, requested, writer = _service(redis_url, timeout_s=30)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    stream = service.names.detok("d0")
    writer.send(stream, TokenBatch("worker:0", [TokenItem("r1", [0, 1], output_tokens=2)]))
    requested.set()
    time.sleep(0.6)
    assert thread.is_alive()  # the request is still open
    writer.send(stream, TokenBatch("worker:0", [TokenItem("r1", [2], finish_reason="length", output_tokens=3)]))
    thread.join(5)
    assert not thread.is_alive()
    texts = _texts(service)
    assert "".join(t.text for t in texts) == "abc" and texts[-1].finish_reason == "length"


def test_what_is_open_at_the_drain_timeout_ends_with_an_error_and_an_abort(redis_url: str) -> None:
    service, requested, writer = _service(redis_url, timeout_s=0.3)
    writer.send(service.names.detok("d0"), TokenBatch("worker:0", [TokenItem("r1", [0], output_tokens=1)]))
    requested.set()
    started = time.monotonic()
    service.run()
    assert time.monotonic() - started < 5
    texts = _texts(service)
    assert texts[-1].finish_reason == FINISH_ERROR and "shut down" in texts[-1].error
    router = StreamReader(service.link, service.names.router, "router", "c").read(count=10, block_ms=100)
    assert [(e.msg.rid, type(e.msg)) for e in router] == [("r1", AbortReq)]
