"""tools/http_stream.py against a real TCP server that answers the ways a server may: chunked
bodies in pieces, sized bodies, keep-alive and close, a kept connection the server has
dropped, a body cut short, bytes that are not HTTP."""

from __future__ import annotations

import asyncio

import pytest

from tools.http_stream import HTTPStreamError, StreamClient


class Server:
    """Answers each request on a connection with the next of ``answers`` (a list of byte
    strings written with a pause between them; None closes the connection)."""

    def __init__(self, answers: list[list[bytes | None]]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.startswith(b"content-length"))
                self.requests.append(head + await reader.readexactly(length))
                for part in self.answers.pop(0):
                    if part is None:
                        writer.close()
                        return
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except asyncio.IncompleteReadError:
            pass
        writer.close()


def chunked(*pieces: bytes) -> list[bytes | None]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces] + [b"0\r\n\r\n"]


def sized(status: bytes, body: bytes, close: bool = False) -> list[bytes | None]:
    conn = b"connection: close\r\n" if close else b""
    return [b"HTTP/1.1 %s\r\ncontent-length: %d\r\n%s\r\n%s" % (status, len(body), conn, body)]


def test_a_chunked_stream_arrives_piece_by_piece_and_splits_into_lines() -> None:
    async def run() -> None:
        async with Server([chunked(b"data: 1\n\nda", b"ta: 2\n\n", b"data: [DONE]\n\n")]) as srv:
            client = StreamClient(srv.url)
            async with client.request("POST", "/v1/completions", b'{"a": 1}') as resp:
                assert resp.status == 200 and resp.headers[b"content-type"] == b"text/event-stream"
                lines = [line async for line in resp.lines()]
            await client.close()
        assert [x for x in lines if x] == [b"data: 1", b"data: 2", b"data: [DONE]"]
        assert srv.requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert srv.requests[0].endswith(b'\r\n\r\n{"a": 1}')

    asyncio.run(run())


def test_the_first_piece_is_handed_over_before_the_rest_is_sent() -> None:
    async def run() -> None:
        answer = chunked(b"first\n", b"second\n")
        answer.insert(2, b"")  # a pause of its own between the two pieces
        async with Server([answer]) as srv:
            client = StreamClient(srv.url)
            async with client.request("POST", "/", b"{}") as resp:
                pieces = resp.pieces()
                assert await anext(pieces) == b"first\n"
                assert len(srv.answers) == 0 and resp._conn.complete is False  # the rest still to come
                assert [p async for p in pieces] == [b"second\n"]
            await client.close()

    asyncio.run(run())


def test_a_connection_is_kept_for_the_next_request_unless_the_server_closes_it() -> None:
    async def run() -> None:
        answers = [sized(b"200 OK", b"one"), sized(b"200 OK", b"two", close=True), sized(b"200 OK", b"three")]
        async with Server(answers) as srv:
            client = StreamClient(srv.url)
            got = []
            for _ in range(3):
                async with client.request("GET", "/v1/models") as resp:
                    got.append(await resp.read())
            await client.close()
        assert got == [b"one", b"two", b"three"]
        assert srv.connections == 2  # the first two on one connection, the third after the close

    asyncio.run(run())


def test_a_kept_connection_the_server_dropped_is_replaced_before_any_answer() -> None:
    async def run() -> None:
        # the first connection answers once, then is dropped on the next request, unanswered
        async with Server([sized(b"200 OK", b"one"), [None], sized(b"200 OK", b"two")]) as srv:
            client = StreamClient(srv.url)
            for want in (b"one", b"two"):
                async with client.request("POST", "/", b"{}") as resp:
                    assert await resp.read() == want
            await client.close()
        assert srv.connections == 2

    asyncio.run(run())


def test_an_error_status_comes_with_its_body() -> None:
    async def run() -> None:
        async with Server([sized(b"400 Bad Request", b'{"error": "max_tokens must be positive"}')]) as srv:
            client = StreamClient(srv.url)
            async with client.request("POST", "/v1/completions", b"{}") as resp:
                assert resp.status == 400
                assert b"max_tokens" in await resp.read()
            await client.close()

    asyncio.run(run())


def test_a_body_cut_short_or_bytes_that_are_not_http_raise() -> None:
    async def run() -> None:
        cut = [*chunked(b"data: 1\n\n")[:2], None]
        async with Server([cut]) as srv:
            client = StreamClient(srv.url)
            with pytest.raises(HTTPStreamError, match="closed"):
                async with client.request("POST", "/", b"{}") as resp:
                    assert await anext(resp.pieces()) == b"data: 1\n\n"
                    await resp.read()
        async with Server([[b"SSH-2.0-OpenSSH\r\n\r\n"]]) as srv:
            with pytest.raises(HTTPStreamError):
                async with StreamClient(srv.url).request("POST", "/", b"{}"):
                    pass

    asyncio.run(run())


def test_nothing_listening_and_unsupported_urls_are_clear_errors() -> None:
    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(HTTPStreamError, match="cannot connect"):
            async with StreamClient(f"http://127.0.0.1:{port}").request("GET", "/"):
                pass

    asyncio.run(run())
    with pytest.raises(ValueError, match="only http"):
        StreamClient("https://example.com")
