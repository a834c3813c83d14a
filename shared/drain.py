"""A back-end service's drain on SIGTERM: it finishes what it holds, within a timeout, then stops.

The signal handler only sets an event (shared/service_main.py, drain_on_signals); the
service's loop asks ``over`` once a turn, saying whether it still holds work. The drain's clock
starts at the first turn that sees the event.
"""

from __future__ import annotations

import threading
import time


class Drain:
    def __init__(self, requested: threading.Event, timeout_s: float, settle_s: float = 0.0) -> None:
        self.requested = requested
        self.timeout_s = timeout_s
        # however soon the service holds nothing, it stays this long: what others sent it before
        # they saw it draining still comes in
        self.settle_s = settle_s
        self.began: float | None = None  # monotonic

    @property
    def draining(self) -> bool:
        return self.requested.is_set()

    def over(self, busy: bool, now: float | None = None) -> bool:
        """Whether the service should stop now: it holds nothing (and the settle time has passed),
        or the timeout has."""
        if not self.requested.is_set():
            return False
        now = time.monotonic() if now is None else now
        if self.began is None:
            self.began = now
        return self.timed_out(now) or (not busy and now >= self.began + self.settle_s)

    def timed_out(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self.began is not None and now >= self.began + self.timeout_s
