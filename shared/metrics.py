"""Prometheus metrics for the services that have no HTTP server of their own.

A service builds a CollectorRegistry with its collectors and calls ``serve_metrics``
with ``CommonConfig.metrics_port``: a daemon thread then answers ``GET /metrics`` on that
port. A registry per service (not prometheus_client's global one) keeps the series of
several services, or of several instances in one test process, apart.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, start_http_server

log = logging.getLogger(__name__)


def serve_metrics(port: int, registry: CollectorRegistry, addr: str = "0.0.0.0") -> bool:
    """Serve ``registry`` at http://addr:port/metrics when port is non-zero; -> whether it serves."""
    if not port:
        return False
    start_http_server(port, addr=addr, registry=registry)
    log.info("metrics at http://%s:%d/metrics", addr, port)
    return True
