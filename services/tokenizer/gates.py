"""What a request must pass before any route sees it: the API key, and the body-size limit on
the bytes read, within a time limit.

The key comes as ``Authorization: Bearer <key>`` (OpenAI's clients and most others) or as
``x-api-key: <key>`` (Anthropic's clients).

A body is read here, whole, before any route runs: Content-Length only says how much a
client means to send (a chunked body says nothing), so the bytes are counted as they come and
past ``max_body_bytes`` the request gets 413 at once, its connection closed, the rest never
read; a body that takes longer than ``body_timeout_s`` gets 408. The routes read the same
bytes from a replay (and the client's later messages, its disconnect, as before).

Plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which would stand
between the routes and the client's disconnect message that aborts a generation.
"""

from __future__ import annotations

import asyncio
import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.tokenizer.errors import error_body

PROBES = frozenset({"/health", "/readiness", "/liveness"})  # answered without a key: load balancers probe them
METRICS = "/metrics"  # answered without a key unless protect_metrics: Prometheus scrapers carry none


def open_paths(protect_metrics: bool) -> frozenset[str]:
    return PROBES if protect_metrics else PROBES | {METRICS}


class BodyTooLarge(Exception):
    pass


class Gates:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        api_keys: tuple[str, ...],
        open_paths: frozenset[str] = PROBES,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.open_paths = open_paths
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.api_keys = tuple(k.encode() for k in api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        path = scope.get("path", "")
        if self.api_keys and path not in self.open_paths and not self._key_ok(headers):
            await _refuse(
                send,
                path,
                401,
                "a valid API key is required (Authorization: Bearer <key>, or x-api-key: <key>)",
                "invalid_api_key",
            )
            return
        length = headers.get(b"content-length")
        too_large = f"the request body is over {self.max_body_bytes} bytes"
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await _refuse(send, path, 413, too_large, "too_large")
            return
        if length is None and b"transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):  # a timer, no task: a lone request's cost matters
                first = await _read_body(receive, self.max_body_bytes)
        except BodyTooLarge:
            await _refuse(send, path, 413, too_large, "too_large")
            return
        except TimeoutError:
            await _refuse(send, path, 408, f"the request body took over {self.body_timeout_s:g}s", "timeout")
            return
        if first["type"] == "http.disconnect":
            return  # the client left mid-upload: nobody to answer, nothing went wrong here
        await self.app(scope, _replay(first, receive), send)

    def _key_ok(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer" or not key.strip():
            key = headers.get(b"x-api-key", b"")
        key = key.strip()
        if not key:
            return False
        # compare with every key, in constant time, so timing tells nothing about them
        found = False
        for k in self.api_keys:
            found |= hmac.compare_digest(k, key)
        return found


async def _read_body(receive: Receive, limit: int) -> Message:
    """The request's body as one message (or the client's disconnect); BodyTooLarge as soon as
    the bytes read pass limit."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return message  # the client left
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}


def _replay(first: Message, receive: Receive) -> Receive:
    """A receive that hands out the body read already, then the client's next messages."""
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _refuse(send: Send, path: str, status: int, message: str, kind: str) -> None:
    body = json.dumps(error_body(path, status, message, kind)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status in (408, 413):  # the rest of the body is not read: the connection cannot be reused
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
