"""Waiting in tests for something another process or thread does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def until(check: Any, timeout_s: float, what: str | Callable[[], str], every_s: float = 0.02) -> Any:
    """check()'s first truthy result, polling; an AssertionError naming what (or what() when it
    is callable, say to show the last state seen) after timeout_s."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s}s: {what() if callable(what) else what}")
