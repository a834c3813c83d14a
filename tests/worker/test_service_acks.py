"""The worker service against a real redis-server: an admission is acknowledged after its
prefill step was launched (nothing goes out between taking it and launching that step), by
the loop's next read or send; and a message that starts no step is acknowledged at once."""

from __future__ import annotations

import threading
import uuid

from services.worker.build import build_engine
from services.worker.service import WorkerService
from shared.config import WorkerConfig
from shared.messages import AbortReqs, AdmitReqs, TokenBatch
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader, StreamWriter
from shared.streams import GROUP_DETOK, GROUP_WORKER, StreamNames
from tests.polling import until
from tests.worker.engine_driver import request


def test_admissions_are_acknowledged_with_their_first_tokens_and_idle_messages_at_once(
    redis_url: str, tiny_llama: str
) -> None:
    names = StreamNames("t" + uuid.uuid4().hex[:8])
    link = RedisLink(redis_url)
    engine = build_engine(WorkerConfig(model_dir=tiny_llama, device="cpu"))
    service = WorkerService(engine, link, names, "0", status_interval_s=0.5, maxlen=1000)
    # (message types sent, acknowledgements, steps launched), in order, from sends and inbox reads
    sends: list[tuple[list[str], int, int]] = []
    real_send = service.writer.send_many
    real_read = service.reader.read

    def recording(items, acks=(), **kw):
        items, acks = list(items), list(acks)
        sends.append(([type(m).__name__ for _, m in items], len(acks), engine.steps))
        real_send(items, acks, **kw)

    def reading(*a, acks=(), **kw):
        acks = list(acks)
        if acks:
            sends.append(([], len(acks), engine.steps))
        return real_read(*a, acks=acks, **kw)

    service.writer.send_many = recording  # type: ignore[method-assign]
    service.reader.read = reading  # type: ignore[method-assign]
    worker_stream = StreamReader(link, names.worker("0"), GROUP_WORKER, consumer="observer")
    detok = StreamReader(link, names.detok("detok"), GROUP_DETOK, consumer="observer")
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        writer = StreamWriter(link)
        admit = AdmitReqs(service.instance, 1, [request("a", [5, 9, 200, 14], max_new_tokens=3)])
        writer.send(names.worker("0"), admit)
        tokens = []
        while sum(len(i.token_ids) for i in tokens) < 3:
            entries = until(lambda: detok.read(block_ms=100), 20, "token batches")
            tokens += [i for e in entries if isinstance(e.msg, TokenBatch) for i in e.msg.items]
        assert [t for i in tokens for t in i.token_ids] and tokens[-1].finish_reason == "length"
        acked = next(k for k, (_, acks, _) in enumerate(sends) if acks)
        assert sends[acked][1] == 1 and sends[acked][2] >= 1  # once, after the prefill was launched
        assert all(steps == 0 for _, _, steps in sends[:acked])  # only the start-up status went out before
        until(lambda: worker_stream.pending_count() == 0, 20, "nothing pending")

        # an abort of a request the worker does not hold starts no step: acknowledged at once
        writer.send(names.worker("0"), AbortReqs(["nobody"], "aborted"))
        until(
            lambda: any(acks == 1 and not types for types, acks, _ in sends[acked + 1 :]), 20, "the abort acknowledged"
        )
        until(lambda: worker_stream.pending_count() == 0, 20, "nothing pending")
    finally:
        link.stop.set()
        thread.join(10)
    assert not thread.is_alive()
