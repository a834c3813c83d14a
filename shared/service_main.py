"""What every service's __main__ does around its own loop: stop on a signal, beat, clean up."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from shared.heartbeat import HeartbeatPublisher
from shared.metrics import labelled, serve_metrics
from shared.redis_link import RedisLink, Stopping

log = logging.getLogger(__name__)


def stop_on_signals(link: RedisLink) -> None:
    """SIGTERM and SIGINT ask the service to stop: its loops watch link.stop."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: link.stop.set())


def drain_on_signals(link: RedisLink, drain: threading.Event) -> None:
    """The first SIGTERM or SIGINT asks the service to drain (its loop watches ``drain``: it
    finishes what it holds, then stops); a second one stops it at once (link.stop)."""

    def on_signal(sig: int, _frame: object) -> None:
        if drain.is_set():
            link.stop.set()
        else:
            log.info("%s: draining", signal.Signals(sig).name)
            drain.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def serve_collector(port: int, collector: Collector, model_name: str) -> None:
    """Prometheus series of one collector on their own port (none when port is 0), each with
    the model_name label."""
    registry = CollectorRegistry()
    registry.register(collector)
    serve_metrics(port, labelled(registry, model_name))


def run_beating(
    name: str, beat: HeartbeatPublisher, run: Callable[[], None], cleanup: Callable[[], None] | None = None
) -> None:
    """Run the service's loop with its heartbeat alive; on the way out remove the heartbeat
    (others see the replica gone at once) and clean up."""
    beat.start()
    try:
        run()
    except Stopping:
        pass
    finally:
        beat.stop()
        if cleanup is not None:
            cleanup()
        log.info("%s stopped", name)
