"""A lean HTTP/1.1 client for the serving benchmark: keep-alive connections, streamed bodies.

A request's bytes go out in one write on a connection kept from an earlier request (or a
new one), and the response is parsed by httptools (uvicorn's parser) as it arrives: the
status and headers, then each piece of the body as soon as it is in, whether the server
sends it chunked or with a Content-Length. A response read to its end leaves its
connection for the next request, unless the server said it would close it.

Why not aiohttp: at low load the benchmark times one request from its first byte out to
its first token in, and aiohttp's own Python on the way out and back was about 0.4 ms of
that on the H200 host, the server's time for nothing. This client does only what the
benchmark needs; ``benchmark_serving.py --client aiohttp`` still measures with aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httptools


class HTTPStreamError(ConnectionError):
    """The connection failed, closed early, or carried a response that would not parse."""


class _Connection(asyncio.Protocol):
    """One TCP connection; its parser's callbacks fill the response being read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._begin()

    def _begin(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.received = False  # any byte of this response
        self.error: BaseException | None = None
        self.pieces: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def send(self, data: bytes) -> None:
        self._begin()
        assert self.transport is not None
        self.transport.write(data)

    async def wait(self) -> None:
        """Until the parser has something new (or the connection failed)."""
        if self.error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.error is not None:
            raise HTTPStreamError(str(self.error) or type(self.error).__name__) from self.error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.error = e
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self.error = exc or EOFError("the server closed the connection before the response ended")
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # known here; the parser forgets it at the end
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class Response:
    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = dict(conn.headers)

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives, in the pieces it arrives in."""
        conn = self._conn
        while True:
            while conn.pieces:
                yield conn.pieces.popleft()
            if conn.complete:
                return
            await conn.wait()

    async def lines(self) -> AsyncIterator[bytes]:
        """The body split at newlines (each line without its b"\\n"), as the lines complete."""
        rest = b""
        async for piece in self.pieces():
            *done, rest = (rest + piece).split(b"\n")
            for line in done:
                yield line
        if rest:
            yield rest

    async def read(self) -> bytes:
        return b"".join([p async for p in self.pieces()])


class StreamClient:
    """Requests to one server (``base_url``: http://host:port), any number at once, each on a
    connection of its own."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"only http://host[:port] URLs are supported, not {base_url!r}")
        self.host = url.hostname
        self.port = url.port or 80
        self.prefix = url.path.rstrip("/")
        self._idle: list[_Connection] = []
        self.connections_opened = 0

    @asynccontextmanager
    async def request(self, method: str, path: str, body: bytes = b"", content_type: str = "application/json"):
        """The response once its headers are in; read its body inside the ``async with``."""
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        conn = await self._send(head + body)
        try:
            yield Response(conn)
        finally:
            self._release(conn)

    async def _send(self, data: bytes) -> _Connection:
        """Send on a kept connection, or a new one if none is kept or the kept one turns out
        closed before any byte of the answer (the server's keep-alive ran out)."""
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._answered(conn, data)
            except HTTPStreamError:
                if conn.received:
                    raise
        return await self._answered(await self._connect(), data)

    @staticmethod
    async def _answered(conn: _Connection, data: bytes) -> _Connection:
        """``conn`` once the answer's headers are in; closed if they never come (an error, a
        timeout)."""
        conn.send(data)
        try:
            while not conn.headers_done:
                await conn.wait()
        except BaseException:
            conn.close()
            raise
        return conn

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port)
        except OSError as e:
            raise HTTPStreamError(f"cannot connect to {self.host}:{self.port}: {e}") from e
        self.connections_opened += 1
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.complete and not conn.closed and conn.keep_alive:
            self._idle.append(conn)
        else:
            conn.close()  # a body not read to its end leaves the connection unusable

    async def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing
