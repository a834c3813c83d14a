"""Errors the front end answers with: a status code and a message that says what is wrong.

Three body shapes, by route family: Anthropic's ``{"type": "error", "error": {"type",
"message"}}`` under /v1/messages, OpenAI's ``{"error": {"message", "type", "param", "code"}}``
elsewhere under /v1, LightLLM's ``{"error": message, "error_type": kind}`` everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from pydantic_core import from_json

from services.tokenizer.streaming import sse
from shared.messages import ERR_DEADLINE, ERR_FAILED, ERR_INVALID, ERR_OVERLOADED, ERR_TOO_LARGE, TextItem

T = TypeVar("T")

if TYPE_CHECKING:
    from services.tokenizer.metrics import FrontMetrics

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads this answer


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request",
        headers: dict[str, str] | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = headers or {}
        self.param = param


def parse_json(raw: bytes) -> Any:
    """A body parsed as the routes' models parse theirs (pydantic's parser), for a route that
    looks at it before its model does: nesting past pydantic's depth limit and lone surrogates
    are a ValueError here as there (the standard library's json raises RecursionError on the
    one and accepts the other, which then fails wherever the text is encoded)."""
    return from_json(raw)


# the HTTP status for each way the pipeline can fail a request (shared.messages.ERROR_KINDS)
_STATUS = {ERR_OVERLOADED: 503, ERR_TOO_LARGE: 400, ERR_DEADLINE: 504, ERR_FAILED: 500, ERR_INVALID: 400}


def pipeline_status(kind: str) -> int:
    return _STATUS.get(kind, 500)


def pipeline_error(error: str, kind: str) -> APIError:
    """The error to answer with for a request the pipeline ended with finish_reason "error"."""
    status = pipeline_status(kind)
    headers = {"Retry-After": "1"} if status == 503 else None
    if kind == ERR_INVALID:  # the worker could not compile the output format asked for
        return APIError(status, f"the output format cannot be used: {error}", kind)
    return APIError(status, f"generation failed: {error}", kind or ERR_FAILED, headers)


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def is_anthropic_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")


# Anthropic's error type for each status (its API reference's list); any other 4xx is a bad request
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    default = "invalid_request_error" if status < 500 else "api_error"
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, default), "message": message}}


def openai_error_body(status: int, message: str, kind: str, param: str | None) -> dict[str, Any]:
    # OpenAI answers a wrong key with type invalid_request_error too (code invalid_api_key)
    kind_of = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind_of, "param": param, "code": kind or None}}


def failed_event(metrics: FrontMetrics, route: str, item: TextItem) -> bytes:
    """The event that ends a stream whose generation failed after it began (counted), in the
    route's dialect: OpenAI's error body, or Anthropic's as an ``error`` event."""
    status = pipeline_status(item.error_kind)
    metrics.error(route, status)
    body = error_body(route, status, f"generation failed: {item.error}", item.error_kind)
    return sse(body, event="error" if is_anthropic_path(route) else "")


def error_body(path: str, status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    if is_anthropic_path(path):
        return anthropic_error_body(status, message)
    if is_openai_path(path):
        return openai_error_body(status, message, kind, param)
    return {"error": message, "error_type": kind}


def error_response(
    path: str, status: int, message: str, kind: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(path, status, message, kind, param), status_code=status, headers=headers)


def _where(err: dict[str, Any]) -> str:
    # union members add their type to the location (stop.str, stop.list[str]): drop them
    return ".".join(str(x) for x in err.get("loc", ()) if x != "body" and not _is_type_tag(str(x)))


def _is_type_tag(part: str) -> bool:
    return part in ("str", "int", "float", "bool", "none") or "[" in part


def describe_validation(errors: list[dict[str, Any]]) -> str:
    """Pydantic's error list -> one sentence per problem, each naming the parameter."""
    parts = []
    for err in errors:
        where = _where(err) or "body"
        kind = err.get("type", "")
        if kind == "json_invalid":
            ctx = err.get("ctx", {}).get("error", "")
            parts.append(f"the request body is not valid JSON ({ctx})" if ctx else "the request body is not valid JSON")
        elif kind == "extra_forbidden":
            parts.append(f"{where}: unknown parameter")
        elif kind == "missing":
            parts.append(f"{where}: required")
        else:
            msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f", got {got!r}"
            parts.append(f"{where}: {msg}{shown}")
    return "; ".join(dict.fromkeys(parts))


def validation_param(errors: list[dict[str, Any]]) -> str | None:
    """The parameter the first problem is about, as OpenAI's error body names it."""
    for err in errors:
        where = _where(err)
        if where:
            return where
    return None


def validation_response(path: str, errors: list[dict[str, Any]]) -> JSONResponse:
    """The 400 for a body that pydantic refused, one sentence per problem."""
    return error_response(path, 400, describe_validation(errors), "validation", validation_param(errors))


def api_error_response(path: str, exc: APIError) -> JSONResponse:
    return error_response(path, exc.status, exc.message, exc.kind, exc.param, exc.headers)


async def parsed_body(request: Request, parse: Callable[[bytes], T]) -> T:
    """parse(the request's body); what pydantic refuses is raised as FastAPI's own refusals are,
    for validation_handler to answer in the route's API's shape."""
    try:
        return parse(await request.body())
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


async def validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    return validation_response(request.url.path, list(exc.errors()))


async def api_error_handler(request: Request, exc: APIError) -> JSONResponse:
    return api_error_response(request.url.path, exc)
