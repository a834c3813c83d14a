"""One line per event, as text or as JSON, with service, replica and request id."""

from __future__ import annotations

import json
import logging

import pytest

from shared.config import ConfigError, RouterConfig
from shared.log import request_id, setup_logging


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_json_lines_carry_the_same_event(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("router", "r0", "INFO", "json")
    log = logging.getLogger("services.router.core")
    log.info("placed on group %s", "1", extra={"rid": "abc"})
    token = request_id.set("from-context")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    finally:
        request_id.reset(token)
    first, second = (json.loads(line) for line in _lines(capsys) if line.startswith("{"))
    assert first | {"time": ""} == {
        "time": "",
        "level": "INFO",
        "service": "router",
        "replica": "r0",
        "rid": "abc",
        "logger": "services.router.core",
        "message": "placed on group 1",
    }
    assert second["rid"] == "from-context" and second["level"] == "ERROR" and "ValueError: boom" in second["exception"]


def test_text_lines_stay_as_they_were(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("worker", "w0")
    logging.getLogger("x").warning("careful")
    (line,) = _lines(capsys)
    assert line.endswith(" WARNING worker/w0 rid=- x: careful")


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ConfigError, match="log_format"):
        RouterConfig(log_format="xml")
