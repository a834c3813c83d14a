"""A detokenizer shard's drain against a real redis-server: it serves its open requests to their
end and then stops; at the drain timeout it lets its stream go with what is still open, for
another shard to take over (test_takeover.py)."""

from __future__ import annotations

import threading
import time
import uuid

from services.detokenizer.service import DetokenizerService
from shared.drain import Drain
from shared.messages import DetokRegister, TextBatch, TokenBatch, TokenItem
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import StreamNames


class Letters:
    """A decoder: token k is the k-th letter."""

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


def shard(link: RedisLink, names: StreamNames, name: str, timeout_s: float = 30) -> DetokenizerService:
    service = DetokenizerService(link, names, name, Letters(), 1000, drain=Drain(threading.Event(), timeout_s, 0.2))
    service.take_own_stream()
    return service


def texts(link: RedisLink, names: StreamNames) -> list:
    front = StreamReader(link, names.front("f0"), "front", "c").read(count=100, block_ms=100)
    return [i for e in front if isinstance(e.msg, TextBatch) for i in e.msg.items]


def register(writer: StreamWriter, names: StreamNames, name: str = "d0") -> None:
    writer.send(names.detok(name), DetokRegister("r1", "f0", 3, [], True, time.time() + 60))


def test_a_drain_serves_the_open_request_to_its_end_then_stops(redis_url: str) -> None:
    link, names = RedisLink(redis_url), StreamNames("t" + uuid.uuid4().hex[:8])
    writer = StreamWriter(link)
    service = shard(link, names, "d0")
    register(writer, names)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    stream = names.detok("d0")
    writer.send(stream, TokenBatch("worker:0", [TokenItem("r1", [0, 1], output_tokens=2)]))
    assert service.drain is not None
    service.drain.requested.set()
    time.sleep(0.6)
    assert thread.is_alive()  # the request is still open
    writer.send(stream, TokenBatch("worker:0", [TokenItem("r1", [2], finish_reason="length", output_tokens=3)]))
    thread.join(5)
    assert not thread.is_alive()
    got = texts(link, names)
    assert "".join(t.text for t in got) == "abc" and got[-1].finish_reason == "length"
    assert service.reader.pending_count() == 0  # the registration acknowledged at the end


def test_at_the_drain_timeout_what_is_open_is_left_in_the_stream_for_a_takeover(redis_url: str) -> None:
    link, names = RedisLink(redis_url), StreamNames("t" + uuid.uuid4().hex[:8])
    writer = StreamWriter(link)
    service = shard(link, names, "d0", timeout_s=0.3)
    register(writer, names)
    writer.send(names.detok("d0"), TokenBatch("worker:0", [TokenItem("r1", [0], output_tokens=1)]))
    assert service.drain is not None
    service.drain.requested.set()
    started = time.monotonic()
    service.run()
    assert time.monotonic() - started < 5
    assert [t.text for t in texts(link, names)] == ["a"]  # no error: the request goes on elsewhere
    assert service.reader.pending_count() == 1 and not service.own.owner.holder()
