"""python -m services.detokenizer: the detokenizer service."""

from __future__ import annotations

import logging
import os
import signal

from prometheus_client import CollectorRegistry
from transformers import AutoTokenizer

from services.detokenizer.metrics import DetokCollector, DetokMetrics
from services.detokenizer.service import DetokenizerService
from shared.cli import parse_config
from shared.config import DetokenizerConfig
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.metrics import serve_metrics
from shared.redis_link import RedisLink, Stopping
from shared.streams import SERVICE_DETOK, StreamNames

log = logging.getLogger("services.detokenizer")


class _FastDecoder:
    """Decode through the Rust tokenizer directly: the Python wrapper costs more than the decode."""

    def __init__(self, model_dir: str) -> None:
        self._tok = AutoTokenizer.from_pretrained(model_dir).backend_tokenizer

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


def main() -> None:
    cfg = parse_config(DetokenizerConfig, None, os.environ)
    setup_logging(SERVICE_DETOK, cfg.replica, cfg.log_level)
    link = RedisLink(cfg.redis_url)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: link.stop.set())
    names = StreamNames(cfg.namespace)
    metrics = DetokMetrics(cfg.replica)
    service = DetokenizerService(link, names, cfg.replica, _FastDecoder(cfg.model_dir), cfg.stream_maxlen, metrics)
    registry = CollectorRegistry()
    registry.register(DetokCollector(metrics, lambda: len(service.sessions)))
    serve_metrics(cfg.metrics_port, registry)
    beat = HeartbeatPublisher(link, names, SERVICE_DETOK, cfg.replica, info=lambda: {"sessions": len(service.sessions)})
    beat.start()
    try:
        service.run()
    except Stopping:
        pass
    finally:
        beat.stop()
        log.info("detokenizer stopped")


if __name__ == "__main__":
    main()
