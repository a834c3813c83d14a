"""Turn the text items of one request into LightLLM's response shapes."""

from __future__ import annotations

from services.tokenizer.collected import Collected
from services.tokenizer.streaming import sse
from services.tokenizer.tokenization import Tokenization
from shared.messages import FINISH_ERROR, TextItem


def generate_response(outs: list[Collected], details: bool, tok: Tokenization, cached_tokens: int) -> dict:
    """LightLLM's /generate body. With n > 1, as LightLLM: generated_text holds n texts and
    the per-sequence fields become lists in the same order. The prompt counts once, and so
    does cached_tokens, the prompt tokens the prompt cache held (LightLLM's prompt_cache_len)."""
    one = len(outs) == 1

    def per_sequence(values: list) -> object:
        return values[0] if one else values

    body: dict = {
        "generated_text": [c.text for c in outs],
        "count_output_tokens": per_sequence([c.output_tokens for c in outs]),
        "finish_reason": per_sequence([c.finish_reason for c in outs]),
        "prompt_tokens": outs[0].prompt_tokens,
        "prompt_cache_len": cached_tokens,
    }
    if details:
        body["tokens"] = per_sequence([_token_details(c, tok) for c in outs])
    return body


def _token_details(c: Collected, tok: Tokenization) -> list[dict]:
    return [
        {"id": t, "text": tok.token_text(t), "logprob": lp, "special": t in tok.special_ids}
        for t, lp in zip(c.token_ids, c.token_logprobs(), strict=True)
    ]


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
        return [sse(body)]
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
        "details": {
            "prompt_tokens": item.prompt_tokens,
            "prompt_cache_len": item.cached_tokens,
            "generated_tokens": item.output_tokens,
        }
        if (details and finished)
        else None,
    }
    return sse(body)
