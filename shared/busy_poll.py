"""Polling Redis instead of sleeping in a blocking read, while requests are in flight.

A service asleep in a blocking XREADGROUP is woken when an entry arrives, and on a host
whose idle CPUs sleep deeply that wake is most of a hop: on the H200 host a lone
request's four hops took 0.46-0.52 ms each through blocking reads and 0.23-0.34 ms
through reads that never block (docs/benchmarks.md, r42). So a service reads without
BLOCK, over and over, while it has requests in flight and for a window after the last
one ended, and then goes back to blocking reads. A client that sends its next request
as the last one ends finds every hop awake. The price is one CPU per polling service,
and Redis answering its reads, for as long as the polling lasts.

``busy_poll_ms`` (every service's config) is the window: 0 never polls; below 0 (the
default) means DEFAULT_WINDOW_MS on a host with at least AUTO_MIN_CPUS CPUs for this
process, and no polling on a smaller one, where the polling would take the CPUs that the
services and the worker need.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from shared.redis_streams import Entry, StreamReader

log = logging.getLogger(__name__)

DEFAULT_WINDOW_MS = 200.0
AUTO_MIN_CPUS = 8
# Redis ends a BLOCK that nothing answers on its own clock (every 100 ms at the default hz 10):
# a 5 ms BLOCK lasts up to 100 ms, so a shorter wait is made by polling
BLOCK_CLOCK_MS = 100


def window_s(busy_poll_ms: float, cpus: int) -> float:
    """The polling window in seconds for a ``busy_poll_ms`` setting on a host with ``cpus`` CPUs."""
    if busy_poll_ms < 0:
        busy_poll_ms = DEFAULT_WINDOW_MS if cpus >= AUTO_MIN_CPUS else 0.0
    return busy_poll_ms / 1000.0


def host_cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, not the machine's count)."""
    return len(os.sched_getaffinity(0))


class BusyPoll:
    """Whether a reader polls now: while its service is busy and window_s after."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic, spin: bool = False) -> None:
        """``spin``: the polling reads wait for Redis's answers without sleeping
        (shared/spin_read.py); only for a reader that is its process's one busy thread."""
        self.window_s = window_s
        self.clock = clock
        self.spin = spin
        self._until = 0.0

    @classmethod
    def for_host(cls, busy_poll_ms: float, spin: bool = False, by: str = "") -> BusyPoll:
        """The setting resolved for this host, and said in the log (``by``: who makes the polls,
        where that is not the reading thread itself)."""
        cpus = host_cpus()
        poll = cls(window_s(busy_poll_ms, cpus), spin=spin)
        if poll.window_s > 0:
            how = ", spinning on each answer" if spin else f", by {by}" if by else ""
            log.info("reads poll Redis%s while requests are in flight and %.0f ms after", how, 1000 * poll.window_s)
        else:
            log.info("reads block (busy_poll_ms=%g, %d CPUs)", busy_poll_ms, cpus)
        return poll

    def note(self, busy: bool) -> None:
        """Called by the service's loop each round: are requests in flight?"""
        if busy and self.window_s > 0:
            self._until = self.clock() + self.window_s

    def polling(self) -> bool:
        return self.left_s() > 0

    def left_s(self) -> float:
        """How much of the window is left (0: not polling)."""
        return max(0.0, self._until - self.clock()) if self.window_s > 0 else 0.0

    def read(self, reader: StreamReader, count: int, block_ms: int, acks: list[Entry] | None = None) -> list[Entry]:
        """What ``reader.read(count, block_ms, acks)`` returns, with no wait longer than block_ms.
        Inside the window it reads without BLOCK until an entry comes or the wait is over; so
        does a wait shorter than BLOCK_CLOCK_MS, which a BLOCK would stretch. Otherwise one
        blocking read waits out what is left. ``acks`` go with the first read."""
        acks = acks or []
        end = self.clock() + block_ms / 1000.0
        left_ms = block_ms
        while True:
            if left_ms >= BLOCK_CLOCK_MS and not self.polling():
                return reader.read(count=count, block_ms=left_ms, acks=acks)
            out = reader.read(count=count, block_ms=None, acks=acks, spin=self.spin)
            acks = []
            now = self.clock()
            if out or now >= end:
                return out
            left_ms = int((end - now) * 1000.0)
