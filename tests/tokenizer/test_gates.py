"""The gates' body limit on the bytes read (a chunked body says nothing of its size), its time
limit, and the body handed to the route unchanged."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from services.tokenizer.gates import Gates

MB = 1024 * 1024


class Echo:
    """The route behind the gates: answers with the body it reads, then the client's next message."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        after = (await receive())["type"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps({"len": len(body), "after": after}).encode()})


class Client:
    """A client sending a body in chunks, counted as the server pulls them."""

    def __init__(self, chunk: int, chunks: int, gap_s: float = 0.0) -> None:
        self.chunk, self.chunks, self.gap_s = chunk, chunks, gap_s
        self.pulled = 0  # bytes the server has read

    async def receive(self) -> dict:
        if self.pulled >= self.chunk * self.chunks:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}
        await asyncio.sleep(self.gap_s)
        self.pulled += self.chunk
        more = self.pulled < self.chunk * self.chunks
        return {"type": "http.request", "body": b"x" * self.chunk, "more_body": more}


def _call(gates: Gates, client: Client, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict, dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": headers}
    asyncio.run(gates(scope, client.receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], dict(sent[0]["headers"]), json.loads(body)


CHUNKED = [(b"transfer-encoding", b"chunked")]


def test_a_200mb_chunked_body_is_refused_after_at_most_the_limits_bytes() -> None:
    client = Client(chunk=64 * 1024, chunks=200 * 16)  # 200 MB, as the server pulls it
    status, headers, body = _call(Gates(Echo(), 1 * MB, ()), client, CHUNKED)
    assert status == 413 and "over 1048576 bytes" in body["error"]
    assert client.pulled <= 1 * MB + 64 * 1024  # one chunk past the limit, never the rest
    assert headers[b"connection"] == b"close"  # the rest is never read: the connection cannot serve again


def test_a_body_within_the_limit_reaches_the_route_whole_and_its_disconnect_after_it() -> None:
    client = Client(chunk=1000, chunks=5)
    assert _call(Gates(Echo(), 1 * MB, ()), client, CHUNKED)[2] == {"len": 5000, "after": "http.disconnect"}
    sized = Client(chunk=1000, chunks=1)
    assert _call(Gates(Echo(), 1 * MB, ()), sized, [(b"content-length", b"1000")])[2]["len"] == 1000


def test_a_declared_length_over_the_limit_is_refused_before_any_byte_is_read() -> None:
    client = Client(chunk=1000, chunks=5)
    status, headers, _ = _call(Gates(Echo(), 1000, ()), client, [(b"content-length", b"5000")])
    assert (status, client.pulled, headers[b"connection"]) == (413, 0, b"close")


def test_a_body_slower_than_its_time_limit_gets_408() -> None:
    client = Client(chunk=10, chunks=100, gap_s=0.05)  # 5 s of dribbling
    status, headers, body = _call(Gates(Echo(), 1 * MB, (), body_timeout_s=0.3), client, CHUNKED)
    assert status == 408 and "took over 0.3s" in body["error"] and headers[b"connection"] == b"close"


def test_a_client_that_leaves_mid_upload_reaches_no_route() -> None:
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict:
        return messages.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": CHUNKED}
    asyncio.run(Gates(Echo(), MB, ())(scope, receive, send))
    assert sent == []  # no 500, no traceback: there is no one to answer


def _keyed(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"10"), *headers]}
    asyncio.run(Gates(Echo(), MB, ("k1", "k2"))(scope, Client(chunk=10, chunks=1).receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_the_key_comes_as_a_bearer_token_or_as_anthropics_x_api_key() -> None:
    assert _keyed("/generate", [(b"authorization", b"Bearer k2")])[0] == 200
    assert _keyed("/v1/messages", [(b"x-api-key", b"k1")])[0] == 200
    assert _keyed("/v1/messages", [(b"authorization", b"Basic k1"), (b"x-api-key", b"k2")])[0] == 200
    status, body = _keyed("/v1/messages", [(b"x-api-key", b"nope")])
    assert status == 401 and body["type"] == "error" and body["error"]["type"] == "authentication_error"
    status, body = _keyed("/v1/chat/completions", [])
    assert status == 401 and body["error"]["code"] == "invalid_api_key"  # OpenAI's shape there
