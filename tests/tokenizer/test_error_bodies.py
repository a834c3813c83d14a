"""Error bodies by route family: Anthropic's under /v1/messages, OpenAI's elsewhere under /v1,
LightLLM's everywhere else; Anthropic's error type follows the status."""

from __future__ import annotations

import pytest

from services.tokenizer.errors import error_body


def test_each_family_gets_its_shape() -> None:
    anthropic = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: required"}}
    assert error_body("/v1/messages", 400, "max_tokens: required", "validation", "max_tokens") == anthropic
    assert error_body("/v1/messages/count_tokens", 400, "max_tokens: required", "validation") == anthropic
    openai = error_body("/v1/chat/completions", 400, "bad", "validation", "n")
    assert openai == {"error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "validation"}}
    assert error_body("/v1/messagesX", 400, "bad", "validation")["error"]["code"] == "validation"  # not Anthropic's
    assert error_body("/generate", 400, "bad", "validation") == {"error": "bad", "error_type": "validation"}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (405, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
    ],
)
def test_anthropics_error_type_follows_the_status(status: int, kind: str) -> None:
    assert error_body("/v1/messages", status, "m", "x")["error"]["type"] == kind
