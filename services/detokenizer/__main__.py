"""python -m services.detokenizer: the detokenizer service."""

from __future__ import annotations

import os
import threading

from transformers import AutoTokenizer

from services.detokenizer.metrics import DetokCollector, DetokMetrics
from services.detokenizer.service import DetokenizerService
from shared.busy_poll import BusyPoll
from shared.cli import parse_config
from shared.config import DetokenizerConfig
from shared.drain import Drain
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.redis_link import RedisLink, RedisTarget
from shared.service_main import drain_on_signals, run_beating, serve_collector
from shared.streams import SERVICE_DETOK, StreamNames


class _FastDecoder:
    """Decode through the Rust tokenizer directly: the Python wrapper costs more than the decode."""

    def __init__(self, model_dir: str) -> None:
        self._tok = AutoTokenizer.from_pretrained(model_dir).backend_tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


def main() -> None:
    cfg = parse_config(DetokenizerConfig, None, os.environ)
    setup_logging(SERVICE_DETOK, cfg.replica, cfg.log_level, cfg.log_format)
    link = RedisLink(RedisTarget.of(cfg))
    drain_requested = threading.Event()
    drain_on_signals(link, drain_requested)
    names = StreamNames(cfg.namespace)
    metrics = DetokMetrics(cfg.replica)
    service = DetokenizerService(
        link,
        names,
        cfg.replica,
        _FastDecoder(cfg.tokenizer or cfg.model_dir),
        cfg.stream_maxlen,
        metrics,
        BusyPoll.for_host(cfg.busy_poll_ms),
        # a registration that comes after it stopped waits in its stream for a shard to take over
        Drain(drain_requested, cfg.drain_timeout_s),
    )
    serve_collector(cfg.metrics_port, DetokCollector(metrics, lambda: len(service.sessions)), cfg.served_model_name())
    beat = HeartbeatPublisher(
        link,
        names,
        SERVICE_DETOK,
        cfg.replica,
        info=lambda: {"sessions": len(service.sessions), "draining": float(service.draining)},
    )
    service.take_own_stream()  # before the heartbeat: front ends send it nothing until it serves its stream
    run_beating("detokenizer", beat, service.run)


if __name__ == "__main__":
    main()
