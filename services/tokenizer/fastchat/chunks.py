"""What a FastChat model worker answers: cumulative-text chunks, each a JSON object and a NUL
byte on /worker_generate_stream, the last one alone on /worker_generate; errors as chunks
with a FastChat error code (and HTTP 200, which is what FastChat's API server reads)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from services.tokenizer.collected import Collected
from services.tokenizer.errors import APIError, pipeline_status
from services.tokenizer.openai import responses as shape
from services.tokenizer.tokenization import Tokenization
from shared.messages import ERR_OVERLOADED, ERR_TOO_LARGE, TextItem

# fastchat.constants.ErrorCode (FastChat is not a dependency of the server)
VALIDATION_TYPE_ERROR = 40001
PARAM_OUT_OF_RANGE = 40302
CONTEXT_OVERFLOW = 40303
ENGINE_OVERLOADED = 42903
INTERNAL_ERROR = 50001


def encode(chunk: dict[str, Any]) -> bytes:
    return json.dumps(chunk, ensure_ascii=False).encode() + b"\0"


def error_code(status: int, kind: str) -> int:
    if kind in ("context_length_exceeded", ERR_TOO_LARGE):
        return CONTEXT_OVERFLOW
    if kind == "validation":
        return VALIDATION_TYPE_ERROR
    if status == 503 or kind == ERR_OVERLOADED:
        return ENGINE_OVERLOADED
    return PARAM_OUT_OF_RANGE if 400 <= status < 500 else INTERNAL_ERROR


def error_chunk(e: APIError) -> dict[str, Any]:
    return {"text": e.message, "error_code": error_code(e.status, e.kind)}


def failed_chunk(item: TextItem) -> dict[str, Any]:
    """The chunk for a generation the pipeline ended with an error after it began."""
    return {"text": f"generation failed: {item.error}", "error_code": error_code(pipeline_status(item.error_kind), "")}


@dataclass
class Progress:
    """One generation as FastChat sees it: everything so far, in every chunk."""

    prefix: str  # the prompt, when echo is on
    prompt_tokens: int
    logprobs: shape.CompletionLogprobs | None  # when the caller asked for logprobs
    prompt_ids: list[int]  # with echo and logprobs, until their entries are in (they come first)
    text: str = ""
    completion_tokens: int = 0
    lp: dict[str, list[Any]] = field(
        default_factory=lambda: {"text_offset": [], "tokens": [], "token_logprobs": [], "top_logprobs": []}
    )

    @classmethod
    def start(cls, prompt: str, echo: bool, prompt_ids: list[int], tok: Tokenization, k: int | None) -> Progress:
        """With echo and logprobs, the logprobs cover the prompt's tokens first, as FastChat's own
        worker gives them (the first token's null); not a prompt with images (pseudo-ids there)."""
        prefix = prompt if echo else ""
        lp = None if k is None else shape.CompletionLogprobs(tok, k, len(prefix))
        scored = echo and lp is not None and min(prompt_ids, default=0) >= 0
        return cls(prefix, len(prompt_ids), lp, prompt_ids if scored else [])

    def add(self, item: TextItem | Collected) -> bool:
        """Take in one item (or a whole generation); whether the text grew."""
        self.completion_tokens = max(self.completion_tokens, item.output_tokens)
        if self.logprobs is not None and item.token_ids:
            got = self.logprobs.of(item.token_ids, item.logprobs, item.top_logprobs)
            if self.prompt_ids:
                got = shape.with_prompt(self.logprobs.tok, self.logprobs.k, self.prompt_ids, item, got)
                self.prompt_ids = []
            for key, values in got.items():
                self.lp[key].extend(values)
        self.text += item.text
        return bool(item.text)

    def chunk(self, reason: str = "") -> dict[str, Any]:
        """The chunk for the text so far; reason is LightStream's finish reason, or "" while going."""
        out: dict[str, Any] = {
            "text": self.prefix + self.text,
            "error_code": 0,
            "usage": shape.usage(self.prompt_tokens, self.completion_tokens),
            "finish_reason": shape.finish_reason(reason),  # FastChat knows "stop" and "length" only
        }
        if self.logprobs is not None:
            out["logprobs"] = {key: list(values) for key, values in self.lp.items()}
        return out
