"""The routes that generate, matched by path in plain ASGI in front of FastAPI's router.

A lone request's first token pays for every line of Python between the socket and the
route, and at low load that Python runs cold: locally, FastAPI's routing, dependency
solving and exception wrappers took 0.55 ms from the request's first byte to the route,
against 0.28 ms here. These routes take one JSON body each, validated by its model straight
from the bytes (pydantic parses and checks in one pass), and answer errors with the bodies
FastAPI's handlers give (errors.py, the same functions). Every other route is FastAPI's.
They stand outside FastAPI (app.py), so a bug in one is answered here with a 500.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from services.tokenizer.errors import APIError, api_error_response, error_response, validation_response

log = logging.getLogger(__name__)

Handler = Callable[[Request, Any, float], Awaitable[Response]]  # (request, validated body or None, arrival)


@dataclass(frozen=True)
class PostRoute:
    body: type[BaseModel] | None  # the body's model; None: the handler reads the body itself
    handle: Handler
    summary: str = ""  # for /openapi.json (openapi_doc.py)
    documented: type[BaseModel] | None = None  # the body /openapi.json shows where ``body`` is None


class PostRoutes:
    """ASGI middleware: POST to one of ``routes``' paths is served here, anything else passes on."""

    def __init__(self, app: ASGIApp, routes: dict[str, PostRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        arrival = time.monotonic()
        request = Request(scope, receive)
        try:
            if scope["method"] != "POST":
                raise APIError(
                    405, f"{scope['method']} is not allowed here: use POST", "method_not_allowed", {"Allow": "POST"}
                )
            body = None if route.body is None else route.body.model_validate_json(await request.body())
            response = await route.handle(request, body, arrival)
        except APIError as e:
            response = api_error_response(scope["path"], e)
        except ValidationError as e:
            response = validation_response(scope["path"], list(e.errors()))
        except Exception as e:  # a bug: logged, and the client still gets an answer in the API's shape
            log.exception("%s failed", scope["path"])
            response = error_response(scope["path"], 500, f"internal error: {type(e).__name__}", "internal")
        await response(scope, receive, send)
