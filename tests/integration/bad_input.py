"""The bad-input cases of the routes that generate, in each dialect's body shape, so that
LightLLM's /generate and FastChat's worker routes are held to the same ones: each must be
answered with a client error naming the problem, never a 500."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEEP = 100_000  # nesting far past any parser's depth limit: the standard library's json recurses on it


@dataclass(frozen=True)
class Dialect:
    prompt_key: str  # "inputs" (LightLLM), "prompt" (FastChat)
    nested: bool  # parameters under "parameters" (LightLLM) or beside the prompt (FastChat)

    def body(self, prompt: Any, params: dict[str, Any] | None = None) -> dict[str, Any]:
        params = params or {}
        head = {} if prompt is None else {self.prompt_key: prompt}
        return {**head, "parameters": params} if self.nested else {**head, **params}

    def raw(self, prompt_json: bytes) -> bytes:
        """A body whose prompt is these bytes as they are, valid JSON or not."""
        rest = b', "parameters": {}' if self.nested else b""
        return b'{"%s": %s%s}' % (self.prompt_key.encode(), prompt_json, rest)


LIGHTLLM = Dialect("inputs", nested=True)
FASTCHAT = Dialect("prompt", nested=False)


def cases(d: Dialect, max_len: int) -> list[tuple[bytes, str]]:
    """(body, what the error must say): the cases both dialects refuse the same way."""

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    key = d.prompt_key
    return [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe invalid utf-8", "not valid JSON"),
        (d.raw(b"[" * DEEP + b"]" * DEEP), "recursion limit exceeded"),
        (d.raw(b'"a lone surrogate \\ud800 escaped"'), "not valid JSON"),
        (d.raw(b'"a lone surrogate \xed\xa0\x80 encoded"'), "not valid JSON"),
        (d.raw(b'"\\udc00 a low one first"'), "not valid JSON"),
        (dumps(["a list"]), "body"),
        (dumps(d.body(None)), f"{key}: required"),
        (dumps(d.body(5)), key),
        (dumps(d.body({"a": "dict"})), key),
        (dumps(d.body("hi", {"max_new_tokens": 0})), "max_new_tokens"),
        (dumps(d.body("hi", {"max_new_tokens": "many"})), "max_new_tokens"),
        (dumps(d.body("hi", {"max_new_tokens": 2 * max_len})), "max_new_tokens"),
        (dumps(d.body("hi", {"top_p": 1.5})), "top_p"),
        (dumps(d.body("hi", {"temperature": -1})), "temperature"),
        (dumps(d.body("hi", {"stop_token_ids": [-1]})), "stop_token_ids"),
        (dumps(d.body("hi", {"stop_token_ids": [10**6]})), "stop_token_ids"),
        (dumps(d.body("word " * 3 * max_len)), f"exceed the model's limit of {max_len}"),
    ]
