"""python -m services.worker: one worker group (a TP group of one rank on the CPU path)."""

from __future__ import annotations

import logging
import os
import signal

from services.worker.build import build_engine
from services.worker.service import WorkerService
from shared.cli import parse_config
from shared.config import WorkerConfig
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.redis_link import RedisLink, Stopping
from shared.streams import SERVICE_WORKER, StreamNames

log = logging.getLogger("services.worker")


def main() -> None:
    cfg = parse_config(WorkerConfig, None, os.environ)
    setup_logging(SERVICE_WORKER, cfg.replica, cfg.log_level)
    link = RedisLink(cfg.redis_url)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: link.stop.set())
    engine = build_engine(cfg)
    names = StreamNames(cfg.namespace)
    service = WorkerService(engine, link, names, cfg.group, cfg.status_interval_s, cfg.stream_maxlen)
    kv = engine.kv
    beat = HeartbeatPublisher(
        link,
        names,
        SERVICE_WORKER,
        cfg.group,
        info=lambda: {"capacity_tokens": kv.capacity, "free_tokens": kv.free_tokens},
    )
    beat.start()
    try:
        service.run()
    except Stopping:
        pass
    finally:
        beat.stop()
        log.info("worker stopped")


if __name__ == "__main__":
    main()
