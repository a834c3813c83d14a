"""Structured logging: one line per event, with service, replica and request id.

A line looks like
    2026-11-29T14:30:00.123Z INFO tokenizer/t0 rid=5f2c... services.tokenizer.app: admitted prompt_tokens=12

The request id comes from ``extra={"rid": ...}`` or, in async code, from the ``request_id``
context variable set for the request's task; lines about no request show ``rid=-``.
``--log-format json`` writes the same event as one JSON object per line instead (time, level,
service, replica, rid, logger, message and, on an error, exception), for log collectors.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class _Formatter(logging.Formatter):
    def __init__(self, service: str, replica: str) -> None:
        super().__init__()
        self.who = f"{service}/{replica}"

    def format(self, record: logging.LogRecord) -> str:
        rid = getattr(record, "rid", None) or request_id.get()
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"{ts}.{int(record.msecs):03d}Z {record.levelname} {self.who} rid={rid} "
            f"{record.name}: {record.getMessage()}"
        )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def __init__(self, service: str, replica: str) -> None:
        super().__init__()
        self.service, self.replica = service, replica

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        event = {
            "time": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "replica": self.replica,
            "rid": getattr(record, "rid", None) or request_id.get(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=False)


LOG_FORMATS = {"text": _Formatter, "json": _JsonFormatter}


def setup_logging(service: str, replica: str, level: str = "INFO", fmt: str = "text") -> None:
    """Route every logger of the process to stderr, one line per event (fmt: text or json)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LOG_FORMATS[fmt](service, replica))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
