"""Draining on SIGTERM: stop taking generations, let those in flight finish, then exit 0.

The first SIGTERM (or SIGINT) does not stop uvicorn at once: the listening socket stays
open, so /readiness answers 503 and a new generation request gets a 503 with Retry-After
(a load balancer moves on), while the requests in flight, streams included, run on. When
none is left, or --drain-timeout-s has passed, the generations still running end with an
explicit error item (their streams with an error event) and uvicorn's own shutdown runs:
it closes the connections once their responses are out. A second signal ends the wait at
once. uvicorn re-raises a signal it handled when it is done, which would end the process
with that signal; the drain handles them itself, so the process exits 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Callable, Collection
from types import FrameType

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from services.tokenizer.errors import error_body

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often the drain looks at the requests in flight
FLUSH_S = 5.0  # after the drain timeout, how long the error events get to go out
CLOSE_S = 5.0  # uvicorn's own graceful shutdown: connections still open after this are cut
RETRY_AFTER_S = 1


class Drain:
    """Whether the front end is draining, and the generation requests it is still serving."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.draining = False
        self.in_flight = 0  # generation requests inside the app, until their last byte is sent
        self.deadline = 0.0  # monotonic: when the requests in flight are failed
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, set at start

    def begin(self) -> None:
        """Readiness goes false and new generation requests are refused from now on."""
        self.draining = True
        self.deadline = time.monotonic() + self.timeout_s

    def hurry(self) -> None:
        """End the wait at once (a second signal)."""
        self.deadline = 0.0

    async def run(self, fail_pending: Callable[[str], int], stop: Callable[[], None]) -> None:
        """Wait for the requests in flight, fail what is left at the deadline, then stop."""
        log.info("draining: %d requests in flight, %.0f s to finish", self.in_flight, self.timeout_s)
        await self._until_idle_or(lambda: self.deadline)
        if self.in_flight:
            failed = fail_pending(f"the server is shutting down (drain timeout of {self.timeout_s:g} s passed)")
            log.warning("drain timeout: ended %d generations still running", failed)
            flush_end = time.monotonic() + FLUSH_S
            await self._until_idle_or(lambda: flush_end)
        log.info("drained; stopping")
        stop()

    async def _until_idle_or(self, end: Callable[[], float]) -> None:
        while self.in_flight and time.monotonic() < end():
            await asyncio.sleep(POLL_S)


class DrainGate:
    """ASGI middleware in front of the routes that generate: while draining they answer 503
    with Retry-After; otherwise each request is counted until its response has ended."""

    def __init__(self, app: ASGIApp, drain: Drain, paths: Collection[str]) -> None:
        self.app = app
        self.drain = drain
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await _refuse(send, scope["path"])
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


async def _refuse(send: Send, path: str) -> None:
    message = "the server is shutting down: send the request to another replica"
    body = json.dumps(error_body(path, 503, message, "unavailable")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose SIGTERM and SIGINT start a drain instead of its shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain, fail_pending: Callable[[str], int]) -> None:
        super().__init__(config)
        self.drain = drain
        self.fail_pending = fail_pending

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self.drain.loop
        if self.drain.draining:
            log.info("%s while draining: ending the drain now", signal.Signals(sig).name)
            self.drain.hurry()
        elif loop is None:  # not serving yet: nothing to drain
            self.should_exit = True
        else:
            self.drain.begin()
            log.info("%s: draining", signal.Signals(sig).name)
            # a signal handler runs between two bytecodes of the loop's thread: hand the work to the loop
            loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        assert self.drain.loop is not None
        task = self.drain.loop.create_task(self.drain.run(self.fail_pending, self._stop))
        self._drain_task = task  # held, so the task is not collected while it runs

    def _stop(self) -> None:
        self.should_exit = True
