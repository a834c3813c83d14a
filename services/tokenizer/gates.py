"""What a request must pass before any route sees it: the body-size limit and the API key.

Plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which would stand
between the routes and the client's disconnect message that aborts a generation.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from services.tokenizer.errors import error_body

PROBES = frozenset({"/health", "/readiness", "/liveness"})  # answered without a key: load balancers probe them
METRICS = "/metrics"  # answered without a key unless protect_metrics: Prometheus scrapers carry none


def open_paths(protect_metrics: bool) -> frozenset[str]:
    return PROBES if protect_metrics else PROBES | {METRICS}


class Gates:
    def __init__(
        self, app: ASGIApp, max_body_bytes: int, api_keys: tuple[str, ...], open_paths: frozenset[str] = PROBES
    ) -> None:
        self.app = app
        self.open_paths = open_paths
        self.max_body_bytes = max_body_bytes
        self.api_keys = tuple(k.encode() for k in api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", ()))
        path = scope.get("path", "")
        if self.api_keys and path not in self.open_paths and not self._key_ok(headers.get(b"authorization", b"")):
            await _refuse(
                send, path, 401, "a valid API key is required (Authorization: Bearer <key>)", "invalid_api_key"
            )
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await _refuse(send, path, 413, f"the request body is over {self.max_body_bytes} bytes", "too_large")
            return
        await self.app(scope, receive, send)

    def _key_ok(self, authorization: bytes) -> bool:
        scheme, _, key = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not key:
            return False
        # compare with every key, in constant time, so timing tells nothing about them
        found = False
        for k in self.api_keys:
            found |= hmac.compare_digest(k, key.strip())
        return found


async def _refuse(send: Send, path: str, status: int, message: str, kind: str) -> None:
    body = json.dumps(error_body(path, status, message, kind)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
