"""OpenAI's response shapes: completions and chat completions, whole and as stream chunks."""

from __future__ import annotations

from typing import Any

from services.tokenizer.token_names import TokenNames
from services.tokenizer.tokenization import Tokenization
from shared.messages import FINISH_LENGTH

TOOL_CALLS = "tool_calls"  # a chat answer that ended with tool calls (not a pipeline reason)


def finish_reason(reason: str) -> str | None:
    """OpenAI's "stop" for an end token, a stop token or string; "length"; "tool_calls"."""
    if not reason:
        return None
    return reason if reason in (FINISH_LENGTH, TOOL_CALLS) else "stop"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with cached_tokens (the prompt tokens the prompt cache held), its
    prompt_tokens_details too, as OpenAI answers it even when nothing was cached."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def _top(entries: list[list[float]], k: int) -> list[tuple[int, float]]:
    return [(int(t), lp) for t, lp in entries[:k]]


# ---------------------------------------------------------------- completions


class CompletionLogprobs:
    """The legacy completions ``logprobs`` object of one choice, built token by token."""

    def __init__(self, tok: TokenNames, k: int, text_offset: int) -> None:
        self.tok = tok
        self.k = k
        self.offset = text_offset

    def of(self, token_ids: list[int], logprobs: list[float], top: list[list[list[float]]]) -> dict[str, Any]:
        tokens, offsets, tops = [], [], []
        for i, t in enumerate(token_ids):
            label = self.tok.token_label(t)
            tokens.append(label)
            offsets.append(self.offset)
            self.offset += len(self.tok.token_text(t))
            # best first, so a label two tokens share keeps the higher logprob; the sampled
            # token is always there, as in OpenAI: up to k + 1 entries
            entries: dict[str, float | None] = {}
            for tid, lp in _top(top[i] if i < len(top) else [], self.k):
                entries.setdefault(self.tok.token_label(tid), lp)
            entries.setdefault(label, logprobs[i] if i < len(logprobs) else None)
            tops.append(entries)
        token_logprobs = [logprobs[i] if i < len(logprobs) else None for i in range(len(token_ids))]
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}

    def prompt(self, token_ids: list[int], logprobs: list[float], top: list[list[list[float]]]) -> dict[str, Any]:
        """The echoed prompt's entries (from offset 0): logprobs and top are its tokens' after the
        first, which has neither (null, as in OpenAI)."""
        first = self.of(token_ids[:1], [], [])
        first["token_logprobs"], first["top_logprobs"] = [None] * len(first["tokens"]), [None] * len(first["tokens"])
        return joined(first, self.of(token_ids[1:], logprobs, top))


def joined(a: dict[str, list], b: dict[str, list]) -> dict[str, list]:
    """Two logprobs objects of consecutive tokens as one."""
    return {key: a[key] + b[key] for key in a}


def with_prompt(tok: TokenNames, k: int, prompt_ids: list[int], c: Any, lp: dict) -> dict:
    """A choice's logprobs lp with the echoed prompt's entries first (their offsets from 0), from
    the prompt logprobs of c (a generation's TextItem or Collected)."""
    prompt = CompletionLogprobs(tok, k, 0).prompt(prompt_ids, c.prompt_logprobs, c.prompt_top_logprobs)
    return joined(prompt, lp)


def completion_choice(
    index: int, text: str, logprobs: dict | None, reason: str, prompt_logprobs: list | None = None
) -> dict[str, Any]:
    """prompt_logprobs: vLLM's (the request asked for them), else no such key."""
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(reason)}
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprobs
    return choice


def vllm_prompt_logprobs(tok: Tokenization, ids: list[int], c: Any, k: int) -> list[dict[str, dict] | None]:
    """vLLM's prompt_logprobs of a generation c (its TextItem or Collected): null for the first
    token, then for each token a map from token id to its logprob, rank and text: the token's own,
    and its position's k most likely (ranks 1 to k)."""
    out: list[dict[str, dict] | None] = [None]
    if len(c.prompt_logprobs) != len(ids) - 1:  # none computed (a prompt with images)
        return out + [None] * (len(ids) - 1)
    for i, t in enumerate(ids[1:]):
        entry = {
            str(t): {"logprob": c.prompt_logprobs[i], "rank": c.prompt_ranks[i], "decoded_token": tok.token_text(t)}
        }
        top = c.prompt_top_logprobs[i] if i < len(c.prompt_top_logprobs) else []
        for rank, (tid, lp) in enumerate(_top(top, k), start=1):
            entry.setdefault(str(tid), {"logprob": lp, "rank": rank, "decoded_token": tok.token_text(tid)})
        out.append(entry)
    return out


def completion(
    rid: str, created: int, model: str, choices: list[dict], use: dict[str, Any] | None, usage_key: bool = False
) -> dict[str, Any]:
    return _envelope(f"cmpl-{rid}", "text_completion", created, model, choices, use, usage_key)


def _envelope(
    rid: str, kind: str, created: int, model: str, choices: list[dict], use: dict[str, Any] | None, usage_key: bool
) -> dict[str, Any]:
    """The fields every completion and chat body has; "usage" when given, or as null when
    usage_key (OpenAI's chunks carry "usage": null when the client asked for usage)."""
    body: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}
    if use is not None or usage_key:
        body["usage"] = use
    return body


# ---------------------------------------------------------------- chat completions


def chat_logprobs(
    tok: TokenNames, token_ids: list[int], logprobs: list[float], top: list[list[list[float]]], k: int
) -> dict[str, Any]:
    def entry(tid: int, lp: float | None) -> dict[str, Any]:  # bytes: the token's own, also when named by id
        return {"token": tok.token_label(tid), "logprob": lp, "bytes": list(tok.token_bytes(tid))}

    content = []
    for i, t in enumerate(token_ids):
        e = entry(t, logprobs[i] if i < len(logprobs) else None)
        e["top_logprobs"] = [entry(tid, lp) for tid, lp in _top(top[i] if i < len(top) else [], k)]
        content.append(e)
    return {"content": content, "refusal": None}


def chat_choice(index: int, message: dict[str, Any], logprobs: dict | None, reason: str) -> dict[str, Any]:
    """message: chat_reader.message's (role, content, and reasoning_content, tool_calls where read)."""
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason(reason)}


def chat_delta(index: int, delta: dict[str, Any], logprobs: dict | None, reason: str) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason(reason)}


def chat(
    rid: str, created: int, model: str, choices: list[dict], use: dict[str, Any] | None, chunk: bool, usage_key: bool
) -> dict:
    """A chat completion, or one chunk of a streamed one. With usage_key, "usage" is there even
    when None (OpenAI's chunks carry "usage": null when the client asked for usage)."""
    kind = "chat.completion.chunk" if chunk else "chat.completion"
    return _envelope(f"chatcmpl-{rid}", kind, created, model, choices, use, usage_key)
