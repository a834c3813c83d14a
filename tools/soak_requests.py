"""The kinds of request a soak (tools/soak.py) sends, each with what its answer must be: a mix of
the APIs and features that share one stack, so that a leak or a lost request in any of them, or
in their meeting, shows.

generate      POST /generate, ignore_eos: exactly max_new tokens
prefix        POST /generate whose prompt starts with one long text every such request shares (the
              prompt cache's hits and evictions)
stream-left   POST /generate_stream, left after its first event (the client disconnects)
schema        POST /v1/chat/completions under a JSON schema (a boolean and an enum): an object the
              schema allows when it stops, the beginning of one when it runs out of tokens
regex         POST /v1/completions under a regular expression (vLLM's guided_regex): its text
              matches it when it stops
score         POST /v1/completions with echo and logprobs (lm-eval's loglikelihood), on the prefix
              requests' shared text: a logprob for each prompt token after the first, and the output's
held          POST /v1/completions sampled (min_p, top_p) with allowed_token_ids of two tokens and a
              logit_bias of -100 on the first: every output token is the second
bad           a request that is wrong (a negative max_new_tokens): a 4xx that says what is wrong

Each takes the client, the served model's name, a prompt and a token count, and returns None
when the answer is as it must be, else what was wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable

import httpx

SHARED_PREFIX = "A system prompt every prefix request shares: answer briefly, kindly and in plain words. " * 6
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
    "required": ["ok", "size"],
    "additionalProperties": False,
}
# every answer SCHEMA allows, its properties in the schema's order, without whitespace
ANSWERS = [f'{{"ok":{ok},"size":"{size}"}}' for ok in ("true", "false") for size in ("small", "large")]
REGEX = "[0-9]{1,6}x"
HELD = (40, 41)  # token ids every tiny model's vocabulary has: held's allowed tokens

Check = Callable[[httpx.AsyncClient, str, str, int], Awaitable[str | None]]  # (client, model, prompt, max_new)


async def generate(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    r = await client.post("/generate", json=body)
    if r.status_code == 200 and r.json().get("count_output_tokens") == max_new:
        return None
    return f"generate: {r.status_code} {r.text}"


async def prefix(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    return await generate(client, model, SHARED_PREFIX + prompt, max_new)


async def stream_left(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    async with client.stream("POST", "/generate_stream", json=body) as r:
        if r.status_code != 200:
            return f"stream-left: {r.status_code} {(await r.aread()).decode(errors='replace')}"
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                return None  # leaving here closes the connection: the stack must free the request
    return "stream-left: the stream ended with no event"


def _answer_prefix(text: str) -> bool:
    """Whether text, its whitespace outside strings dropped (SCHEMA's strings have none), begins
    an answer SCHEMA allows (an answer cut by max_tokens)."""
    squeezed = re.sub(r"\s+", "", text)
    return any(a.startswith(squeezed) for a in ANSWERS)


async def schema(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_new,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "count", "schema": SCHEMA}},
    }
    r = await client.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        return f"schema: {r.status_code} {r.text}"
    choice = r.json()["choices"][0]
    text = choice["message"]["content"] or ""
    if choice["finish_reason"] == "length":
        return None if _answer_prefix(text) else f"schema: a cut answer that begins none the schema allows: {text!r}"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return f"schema: not JSON: {text!r}"
    return None if json.dumps(value, separators=(",", ":")) in ANSWERS else f"schema: not the schema's: {text!r}"


async def regex(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_new, "temperature": 0, "guided_regex": REGEX}
    r = await client.post("/v1/completions", json=body)
    if r.status_code != 200:
        return f"regex: {r.status_code} {r.text}"
    choice = r.json()["choices"][0]
    text = choice["text"]
    if choice["finish_reason"] == "length":
        return None if re.fullmatch(r"[0-9]{0,6}", text) else f"regex: a cut answer off the pattern: {text!r}"
    return None if re.fullmatch(REGEX, text) else f"regex: {text!r} does not match {REGEX}"


async def score(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    body = {"model": model, "prompt": SHARED_PREFIX + prompt, "max_tokens": 1, "logprobs": 1, "echo": True}
    r = await client.post("/v1/completions", json=body)
    if r.status_code != 200:
        return f"score: {r.status_code} {r.text}"
    lp, n = r.json()["choices"][0]["logprobs"]["token_logprobs"], r.json()["usage"]["prompt_tokens"]
    if len(lp) == n + 1 and lp[0] is None and all(v is not None and v <= 0 for v in lp[1:]):
        return None
    return f"score: {len(lp)} logprobs for {n} prompt tokens and 1 output token: {lp[:3]}..."


async def held(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_new,
        "temperature": 1.0,
        "min_p": 0.05,
        "top_p": 0.9,
        "allowed_token_ids": list(HELD),
        "logit_bias": {str(HELD[0]): -100},
        "ignore_eos": True,
    }
    r = await client.post("/v1/completions", json=body)
    want = await client.post("/detokenize", json={"tokens": [HELD[1]] * max_new})
    if r.status_code != 200 or want.status_code != 200:
        return f"held: {r.status_code} {r.text} / detokenize {want.status_code} {want.text}"
    text = r.json()["choices"][0]["text"]
    return None if text == want.json()["prompt"] else f"held: {text!r} is not token {HELD[1]} {max_new} times"


async def bad(client: httpx.AsyncClient, model: str, prompt: str, max_new: int) -> str | None:
    r = await client.post("/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": -max_new}})
    if 400 <= r.status_code < 500 and "max_new_tokens" in r.text:
        return None
    return f"bad: {r.status_code} {r.text} (a 4xx naming max_new_tokens expected)"


CHECKS: dict[str, Check] = {
    "generate": generate,
    "prefix": prefix,
    "stream-left": stream_left,
    "schema": schema,
    "regex": regex,
    "score": score,
    "held": held,
    "bad": bad,
}
KINDS = tuple(CHECKS)
