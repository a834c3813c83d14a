"""The busy-poll rule: a reader polls Redis instead of sleeping in a blocking read while its
service has requests in flight, and for a window after the last one ended.

A process asleep in a blocking XREADGROUP is woken when an entry arrives, and on a host whose
idle CPUs sleep deeply that wake is most of a hop (0.1-0.2 ms on the GPU host). So inside the
window a service reads without BLOCK, one read after another, and a client that sends its next
request as the last one ends finds every hop awake. The price is one CPU per polling service,
and Redis answering its reads, for as long as the polling lasts.

``busy_poll_ms`` (every service's config) is the window: 0 never polls; below 0 (the default)
means DEFAULT_WINDOW_MS on a host with at least AUTO_MIN_CPUS CPUs for this process, and no
polling on a smaller one, where the polling would take the CPUs the services need.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable

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
    """How a reader waits: polling while its service is busy and window_s after, else blocking."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._until = 0.0

    @classmethod
    def for_host(cls, busy_poll_ms: float, by: str = "") -> BusyPoll:
        """The setting resolved for this host, and said in the log (``by``: who makes the polls)."""
        cpus = host_cpus()
        poll = cls(window_s(busy_poll_ms, cpus))
        if poll.window_s > 0:
            how = f", by {by}," if by else ""
            log.info("reads poll Redis%s while requests are in flight and %.0f ms after", how, 1000 * poll.window_s)
        else:
            log.info("reads block (busy_poll_ms=%g, %d CPUs)", busy_poll_ms, cpus)
        return poll

    def note(self, busy: bool) -> None:
        """Called by the service's loop each round: are requests in flight?"""
        if busy and self.window_s > 0:
            self._until = self.clock() + self.window_s

    def polling(self) -> bool:
        return self.window_s > 0 and self.clock() < self._until

    def read(self, reader: StreamReader, count: int, wait_ms: int, acks: Iterable[Entry] = ()) -> list[Entry]:
        """What ``reader.read`` returns, waiting up to wait_ms (0: not at all) for an entry.
        Inside the window it reads without BLOCK until an entry comes or the wait is over; so
        does a wait shorter than BLOCK_CLOCK_MS, which a BLOCK would stretch. Otherwise one
        blocking read waits out what is left. ``acks`` go with the first read."""
        end = self.clock() + wait_ms / 1000.0
        while True:
            block_ms = self._block_ms(end)
            out = reader.read(count=count, block_ms=block_ms, acks=acks)
            acks = ()
            if out or block_ms is not None or self.clock() >= end:
                return out

    async def aread(self, reader: StreamReader, count: int, wait_ms: int, acks: Iterable[Entry] = ()) -> list[Entry]:
        """``read`` for an event loop, through ``reader.aread``."""
        end = self.clock() + wait_ms / 1000.0
        while True:
            block_ms = self._block_ms(end)
            out = await reader.aread(count=count, block_ms=block_ms, acks=acks)
            acks = ()
            if out or block_ms is not None or self.clock() >= end:
                return out

    def _block_ms(self, end: float) -> int | None:
        """The next read's BLOCK for a wait that ends at ``end``: None (a poll) in the window or
        for less than BLOCK_CLOCK_MS, else all that is left."""
        left_ms = round((end - self.clock()) * 1000.0)
        return left_ms if left_ms >= BLOCK_CLOCK_MS and not self.polling() else None
