"""The event that ends an OpenAI stream (completions and chat) whose generation failed after it
began: OpenAI's error body with the status the failure stands for, counted on the route."""

from __future__ import annotations

import json

from services.tokenizer.errors import failed_event
from services.tokenizer.metrics import FrontMetrics
from shared.messages import ERR_OVERLOADED, FINISH_ERROR, TextItem


def test_a_failed_generation_ends_the_stream_with_openais_error_and_is_counted() -> None:
    metrics = FrontMetrics("m")
    item = TextItem("r", "", finish_reason=FINISH_ERROR, error="overloaded", error_kind=ERR_OVERLOADED)
    event = failed_event(metrics, "/v1/chat/completions", item)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    body = json.loads(event[len(b"data: ") :])
    assert body["error"]["message"] == "generation failed: overloaded" and body["error"]["code"] == ERR_OVERLOADED
    assert body["error"]["type"] == "server_error"
    counted = 'lightstream_front_request_errors_total{code="503",model_name="m",route="/v1/chat/completions"} 1.0'
    assert counted in metrics.render().decode().splitlines()
