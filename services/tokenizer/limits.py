"""The bounds every API dialect (lightllm/, openai/, fastchat/) holds a request to.

They follow LightLLM's SamplingParams and OpenAI's API reference; each dialect imports
them from here, never from another dialect.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from services.tokenizer.errors import APIError

GREEDY_TEMPERATURE = 1e-5  # below this, sampling is greedy (as in LightLLM)
MAX_N = 16  # most sequences one request may ask for (n, best_of)
MAX_STOPS = 16
MAX_TOP_LOGPROBS = 20  # as OpenAI

TokenId = Annotated[int, Field(ge=0)]


def check_top_k(v: int | None) -> int | None:
    """top_k is -1 (the whole vocabulary) or at least 1; None (not given) passes."""
    if v is not None and (v == 0 or v < -1):
        raise ValueError("must be -1 (the whole vocabulary) or >= 1")
    return v


def check_stops(v: str | list[str] | None) -> str | list[str] | None:
    """Stop strings: none empty, at most MAX_STOPS of them."""
    stops = [v] if isinstance(v, str) else (v or [])
    if any(s == "" for s in stops):
        raise ValueError("must not contain an empty string")
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop sequences")
    return v


def check_token_ids(ids: list[int], vocab_size: int, name: str) -> None:
    """Token ids a client sent (name: the parameter) must be in [0, vocab_size): else a 400."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"{name}: token ids must be in [0, {vocab_size}), got {bad[0]}", param=name)
