"""The plain-ASGI routes that generate (post_routes.py) and the event stream they answer with,
in process, through httpx's ASGI transport: match by path, body validation, error bodies,
the route family's error shape, and the stream's first event sent ahead of the rest."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp

from services.tokenizer.errors import APIError
from services.tokenizer.post_routes import PostRoute, PostRoutes
from services.tokenizer.streaming import EventStream


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str
    n: int = 1


def make_app(closed: list[str]) -> ASGIApp:
    async def echo(request: Request, body: Body, arrival: float) -> Response:
        if body.n > 3:
            raise APIError(400, "n: at most 3", param="n")
        return JSONResponse({"prompt": body.prompt, "n": body.n, "arrival": arrival > 0})

    async def stream(request: Request, body: Body, arrival: float) -> Response:
        async def events() -> AsyncIterator[bytes]:
            for i in range(body.n):
                yield f"data: {body.prompt}{i}\n\n".encode()
                await asyncio.sleep(0)

        return EventStream(events(), on_close=lambda: closed.append(body.prompt), first_ready=True)

    async def raw(request: Request, body: None, arrival: float) -> Response:
        return JSONResponse({"got": (await request.body()).decode()})

    async def boom(request: Request, body: Body, arrival: float) -> Response:
        raise RuntimeError("a bug")

    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"data": []})

    routes = {
        "/v1/echo": PostRoute(Body, echo),
        "/stream": PostRoute(Body, stream),
        "/raw": PostRoute(None, raw),
        "/v1/boom": PostRoute(Body, boom),
    }
    return PostRoutes(app, routes=routes)  # outside FastAPI, as app.py serves them


@pytest.fixture
def closed() -> list[str]:
    return []


async def call(app: ASGIApp, method: str, path: str, **kw) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.request(method, path, **kw)


def run(coro):
    return asyncio.run(coro)


def test_a_valid_body_reaches_its_route(closed: list[str]) -> None:
    r = run(call(make_app(closed), "POST", "/v1/echo", json={"prompt": "hi", "n": 2}))
    assert r.status_code == 200 and r.json() == {"prompt": "hi", "n": 2, "arrival": True}


def test_other_paths_and_methods_go_to_fastapi_or_get_405(closed: list[str]) -> None:
    app = make_app(closed)
    assert run(call(app, "GET", "/v1/models")).json() == {"data": []}
    assert run(call(app, "GET", "/nowhere")).status_code == 404
    r = run(call(app, "GET", "/v1/echo"))
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert "use POST" in r.json()["error"]["message"]  # OpenAI's error shape under /v1
    r = run(call(app, "GET", "/stream"))
    assert r.status_code == 405 and "use POST" in r.json()["error"]  # LightLLM's elsewhere


@pytest.mark.parametrize(
    ("raw", "needle", "param"),
    [
        (b"{oops", "not valid JSON", None),
        (b"\xff\xfe", "not valid JSON", None),
        (b'{"n": 1}', "prompt: required", "prompt"),
        (b'{"prompt": "x", "bogus": 1}', "bogus: unknown parameter", "bogus"),
        (b'{"prompt": 5}', "prompt: Input should be a valid string", "prompt"),
        (b'["a list"]', "body", None),
    ],
)
def test_a_bad_body_gets_a_400_that_names_the_problem(closed: list[str], raw: bytes, needle: str, param) -> None:
    r = run(call(make_app(closed), "POST", "/v1/echo", content=raw, headers={"Content-Type": "application/json"}))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["param"] == param and err["code"] == "validation"


def test_a_route_error_gets_its_status_and_parameter(closed: list[str]) -> None:
    r = run(call(make_app(closed), "POST", "/v1/echo", json={"prompt": "hi", "n": 4}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


def test_a_bug_in_a_route_gets_a_500_in_the_apis_shape_and_the_next_request_is_served(closed: list[str]) -> None:
    app = make_app(closed)
    r = run(call(app, "POST", "/v1/boom", json={"prompt": "hi"}))
    assert r.status_code == 500 and r.json()["error"]["message"] == "internal error: RuntimeError"
    assert run(call(app, "POST", "/v1/echo", json={"prompt": "hi"})).status_code == 200


def test_a_route_without_a_model_reads_the_body_itself(closed: list[str]) -> None:
    r = run(call(make_app(closed), "POST", "/raw", content=b"anything"))
    assert r.json() == {"got": "anything"}


def test_the_stream_sends_every_event_then_closes(closed: list[str]) -> None:
    r = run(call(make_app(closed), "POST", "/stream", json={"prompt": "p", "n": 3}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text == "data: p0\n\ndata: p1\n\ndata: p2\n\n"
    assert closed == ["p"]


def test_a_stream_whose_body_is_empty_still_ends_and_closes(closed: list[str]) -> None:
    r = run(call(make_app(closed), "POST", "/stream", json={"prompt": "e", "n": 0}))
    assert r.status_code == 200 and r.text == "" and closed == ["e"]


def test_the_first_event_goes_out_before_the_disconnect_listener_and_a_disconnect_ends_the_rest() -> None:
    """The ASGI messages as a server sees them: start and first event at once, then the body
    is cancelled when the client goes away, and on_close runs."""
    closed: list[str] = []
    sent: list[dict] = []
    release = asyncio.Event()

    async def events() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        await release.wait()  # the second never comes: the client leaves first
        yield b"data: second\n\n"

    async def main() -> None:
        disconnect = asyncio.Event()

        async def receive() -> dict:
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message.get("body") == b"data: first\n\n":
                disconnect.set()

        stream = EventStream(events(), on_close=lambda: closed.append("x"), first_ready=True)
        await asyncio.wait_for(stream({"type": "http"}, receive, send), 5)

    asyncio.run(main())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1]["body"] == b"data: first\n\n" and closed == ["x"]
