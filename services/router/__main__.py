"""python -m services.router: the router service."""

from __future__ import annotations

import logging
import os
import signal

from prometheus_client import CollectorRegistry

from services.router.metrics import RouterCollector
from services.router.service import RouterService
from shared.cli import parse_config
from shared.config import RouterConfig
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.metrics import serve_metrics
from shared.redis_link import RedisLink, Stopping
from shared.streams import SERVICE_ROUTER, StreamNames

log = logging.getLogger("services.router")


def main() -> None:
    cfg = parse_config(RouterConfig, None, os.environ)
    setup_logging(SERVICE_ROUTER, cfg.replica, cfg.log_level)
    link = RedisLink(cfg.redis_url)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: link.stop.set())
    service = RouterService(cfg, link)
    registry = CollectorRegistry()
    registry.register(RouterCollector(lambda: service.figures))
    serve_metrics(cfg.metrics_port, registry)
    # the heartbeat carries the queue figures, so front ends can refuse at once when it is full
    names = StreamNames(cfg.namespace)
    beat = HeartbeatPublisher(link, names, SERVICE_ROUTER, cfg.replica, info=lambda: service.figures.info())
    beat.start()
    try:
        service.run()
    except Stopping:
        pass
    finally:
        beat.stop()
        log.info("router stopped")


if __name__ == "__main__":
    main()
