"""python -m services.router: the router service."""

from __future__ import annotations

import os

from services.router.metrics import RouterCollector
from services.router.service import RouterService
from shared.busy_poll import BusyPoll
from shared.cli import parse_config
from shared.config import RouterConfig
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.redis_link import RedisLink, RedisTarget
from shared.service_main import run_beating, serve_collector, stop_on_signals
from shared.streams import SERVICE_ROUTER, StreamNames


def main() -> None:
    cfg = parse_config(RouterConfig, None, os.environ)
    setup_logging(SERVICE_ROUTER, cfg.replica, cfg.log_level, cfg.log_format)
    link = RedisLink(RedisTarget.of(cfg))
    stop_on_signals(link)
    service = RouterService(cfg, link, BusyPoll.for_host(cfg.busy_poll_ms))
    serve_collector(cfg.metrics_port, RouterCollector(lambda: service.figures), cfg.served_model_name())
    # the heartbeat carries the queue figures, so front ends can refuse at once when it is full
    names = StreamNames(cfg.namespace)
    beat = HeartbeatPublisher(link, names, SERVICE_ROUTER, cfg.replica, info=lambda: service.figures.info())
    # on SIGTERM the step in hand is finished; the queue stays pending in the router's stream,
    # and a successor claims it at once (the lease given up)
    run_beating("router", beat, service.run, service.reader.release)


if __name__ == "__main__":
    main()
