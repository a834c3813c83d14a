"""Heartbeats: each service replica keeps a key alive in Redis; readers list the live ones.

A heartbeat is a ``Heartbeat`` message stored under ``<ns>:hb:<service>:<replica>`` with
a time-to-live of a few intervals: when the replica dies, its key expires by itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable

from shared.messages import Heartbeat, WireError, decode, encode
from shared.redis_link import RedisLink, Stopping, maybe
from shared.streams import StreamNames

log = logging.getLogger(__name__)


class HeartbeatPublisher:
    """A daemon thread that refreshes this replica's heartbeat key every interval."""

    def __init__(
        self,
        link: RedisLink,
        names: StreamNames,
        service: str,
        replica: str,
        interval_s: float = 1.0,
        ttl_s: float = 5.0,
        info: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.link = link
        self.key = names.heartbeat(service, replica)
        self.service = service
        self.replica = replica
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.info = info or (lambda: {})
        self.started = time.time()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{service}", daemon=True)

    def start(self) -> HeartbeatPublisher:
        self.beat()
        self._thread.start()
        return self

    def beat(self) -> None:
        hb = Heartbeat(
            service=self.service,
            replica=self.replica,
            pid=os.getpid(),
            started=self.started,
            time=time.time(),
            info={k: float(v) for k, v in self.info().items()},
        )
        data = encode(hb)
        self.link.call(lambda r: r.set(self.key, data, px=self.ttl_ms))

    def stop(self) -> None:
        """Remove the key now so that readers see this replica gone at once."""
        # best effort on the way out: the key expires by itself anyway
        with contextlib.suppress(Exception):
            self.link.client.delete(self.key)

    def _run(self) -> None:
        while not self.link.stop.wait(self.interval_s):
            try:
                self.beat()
            except Stopping:
                return
            except Exception:
                log.exception("heartbeat failed")


def live_replicas(link: RedisLink, names: StreamNames, service: str, once: bool = False) -> dict[str, Heartbeat]:
    """Replica name -> its latest heartbeat, for every live replica of a service. With ``once``,
    one try with a short timeout (RedisLink.try_call): an unreachable Redis raises."""

    def run(r) -> dict[str, Heartbeat]:
        keys = list(r.scan_iter(match=names.heartbeat_pattern(service), count=100))
        if not keys:
            return {}
        out: dict[str, Heartbeat] = {}
        for key, data in zip(keys, r.mget(keys), strict=True):
            if data is None:
                continue
            try:
                hb = decode(data)
            except WireError:
                log.warning("ignoring a malformed heartbeat under %s", maybe(key))
                continue
            out[hb.replica] = hb
        return out

    return link.try_call(run) if once else link.call(run)
