"""Errors the front end answers with: a status code and a message that says what is wrong."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shared.messages import ERR_DEADLINE, ERR_FAILED, ERR_OVERLOADED, ERR_TOO_LARGE


class APIError(Exception):
    def __init__(
        self, status: int, message: str, kind: str = "invalid_request", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = headers or {}


# the HTTP status for each way the pipeline can fail a request (shared.messages.ERROR_KINDS)
_STATUS = {ERR_OVERLOADED: 503, ERR_TOO_LARGE: 400, ERR_DEADLINE: 504, ERR_FAILED: 500}


def pipeline_error(error: str, kind: str) -> APIError:
    """The error to answer with for a request the pipeline ended with finish_reason "error"."""
    status = _STATUS.get(kind, 500)
    headers = {"Retry-After": "1"} if status == 503 else None
    return APIError(status, f"generation failed: {error}", kind or ERR_FAILED, headers)


def describe_validation(errors: list[dict[str, Any]]) -> str:
    """Pydantic's error list -> one sentence per problem, each naming the parameter."""
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) or "body"
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
    return "; ".join(parts)


async def validation_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"error": describe_validation(list(exc.errors())), "error_type": "validation"}, status_code=400)


async def api_error_handler(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse({"error": exc.message, "error_type": exc.kind}, status_code=exc.status, headers=exc.headers)
