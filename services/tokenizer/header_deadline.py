"""A deadline and a size limit for a request's head, which uvicorn does not keep: a connection
that has not sent a whole request line and headers within ``timeout_s`` of connecting, or of
its next request's first byte, or whose head passes ``MAX_HEAD_BYTES``, is closed. Without them
a client that sends a header a minute holds its connection for as long as it likes (uvicorn's
keep-alive timeout runs only between requests), and one header may grow without end. The
body's limits are the gates' (gates.py).

uvicorn's protocol classes are not a public interface, so this subclass of its httptools
protocol is used only with the uvicorn versions it was tested with; with any other the
front end runs uvicorn's own protocol and says so in a log line."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

TESTED_UVICORN = ("0.54.",)
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers past this close the connection


def http_protocol(timeout_s: float) -> Any:
    """uvicorn.Config's ``http``: the protocol class with the deadline, or "auto"."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed: uvicorn runs h11
        log.warning("no deadline for request heads: httptools is not installed")
        return "auto"
    if not uvicorn.__version__.startswith(TESTED_UVICORN):
        log.warning("no deadline for request heads: uvicorn %s is not a tested version", uvicorn.__version__)
        return "auto"

    class HeadDeadline(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_timer: asyncio.TimerHandle | None = None  # set while a head is awaited
            self._head_bytes = 0  # bytes received while it was

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None:  # the head is still incomplete after these bytes
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._expired()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._head_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(timeout_s, self._expired)
            self._head_bytes = 0

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _expired(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.close()

    return HeadDeadline
