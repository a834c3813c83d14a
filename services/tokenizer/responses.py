"""Turn the text items of one request into LightLLM's response shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from services.tokenizer.tokenization import Tokenization
from shared.messages import FINISH_ERROR, TextItem


@dataclass
class Collected:
    """A whole generation, gathered from its text items."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    error_kind: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0

    def add(self, item: TextItem) -> None:
        self.text += item.text
        self.token_ids.extend(item.token_ids)
        self.logprobs.extend(item.logprobs)
        self.prompt_tokens = item.prompt_tokens or self.prompt_tokens
        self.output_tokens = max(self.output_tokens, item.output_tokens)
        if item.finish_reason:
            self.finish_reason = item.finish_reason
            self.error = item.error
            self.error_kind = item.error_kind


def generate_response(c: Collected, details: bool, tok: Tokenization) -> dict:
    body: dict = {
        "generated_text": [c.text],
        "count_output_tokens": c.output_tokens,
        "finish_reason": c.finish_reason,
        "prompt_tokens": c.prompt_tokens,
    }
    if details:
        lps = c.logprobs if len(c.logprobs) == len(c.token_ids) else [None] * len(c.token_ids)
        body["tokens"] = [
            {"id": t, "text": tok.token_text(t), "logprob": lp, "special": t in tok.special_ids}
            for t, lp in zip(c.token_ids, lps, strict=True)
        ]
    return body


def stream_events(item: TextItem, details: bool, tok: Tokenization) -> list[bytes]:
    """One server-sent event per token of the item (LightLLM sends one per token)."""
    finished = bool(item.finish_reason)
    if item.finish_reason == FINISH_ERROR:
        body = {
            "token": None,
            "generated_text": None,
            "finished": True,
            "finish_reason": "error",
            "error": item.error,
            "error_type": item.error_kind,
        }
        return [_sse(body)]
    events = []
    n = len(item.token_ids)
    for i, tid in enumerate(item.token_ids):
        last = i == n - 1
        token = {
            "id": tid,
            "text": item.text if last else "",
            "logprob": item.logprobs[i] if i < len(item.logprobs) else None,
            "special": tid in tok.special_ids,
        }
        events.append(_event(token, finished and last, item, details))
    if not events:  # an end with no new token (aborted, or text released at the end)
        token = {"id": -1, "text": item.text, "logprob": None, "special": True}
        events.append(_event(token, finished, item, details))
    return events


def _event(token: dict, finished: bool, item: TextItem, details: bool) -> bytes:
    body = {
        "token": token,
        "generated_text": None,
        "finished": finished,
        "finish_reason": item.finish_reason or None,
        "details": {"prompt_tokens": item.prompt_tokens, "generated_tokens": item.output_tokens}
        if (details and finished)
        else None,
    }
    return _sse(body)


def _sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
