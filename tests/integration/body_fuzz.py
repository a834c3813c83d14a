"""Valid request bodies for every POST route the front end serves, and their mutations: a field
set to a value of another JSON kind (null, a huge or negative number, an empty or long string, a
nested list or object), a field dropped, an unknown field added, the body cut short. What every
mutation must get is an answer of the API's kind: a 2xx, or a 4xx with an error that says
something, never a 5xx or a dropped connection (test_abuse.py)."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1e308,
    -1e308,
    2**70,
    0.5,
    "",
    "x" * 5000,
    "😀",
    "NaN",
    [],
    {},
    [1, "a"],
    {"a": [None]},
    [[[]]],
]


def bodies(model: str) -> dict[str, Any]:
    """One valid body a route; "route#label" where a route has two."""
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    tool = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
    return {
        "/generate": {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "temperature": 0.5, "stop": ["x"]}},
        "/generate_stream": {"inputs": "Hello", "parameters": {"max_new_tokens": 4}},
        "/": {"inputs": "Hello", "parameters": {"max_new_tokens": 4, "details": True}, "stream": False},
        "/v1/completions": {"model": model, "prompt": "Hi", "max_tokens": 4, "n": 2, "logprobs": 2, "echo": True},
        "/v1/chat/completions": {
            "model": model,
            "messages": chat,
            "max_tokens": 4,
            "response_format": fmt,
            "logprobs": True,
            "top_logprobs": 2,
        },
        "/v1/chat/completions#tools": {"model": model, "messages": chat, "max_tokens": 4, "tools": [tool]},
        "/v1/responses": {"model": model, "input": "hi", "max_output_tokens": 4},
        "/v1/messages": {
            "model": model,
            "max_tokens": 4,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "stop_sequences": ["x"],
            "temperature": 0.5,
        },
        "/v1/messages#tools": {
            "model": model,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": SCHEMA}],
            "tool_choice": {"type": "tool", "name": "f"},
        },
        "/v1/messages/count_tokens": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
        "/tokenize": {"model": model, "prompt": "hello"},
        "/detokenize": {"model": model, "tokens": [1, 2, 3]},
        "/count_token": {"prompt": "hello"},
        "/worker_generate_stream": {"prompt": "hello", "max_new_tokens": 4, "temperature": 0.7},
        "/worker_generate": {"prompt": "hello", "max_new_tokens": 4},
    }


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a body, itself first."""
    out = [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        out += _paths(child, (*path, key))
    return out


def mutate(body: Any, rng: random.Random) -> Any:
    """body with one to three places changed: set to an odd value, dropped, or given a sibling."""
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(body))
        if not path:
            if rng.random() < 0.3:
                return copy.deepcopy(rng.choice(ODD_VALUES))
            continue
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        roll = rng.random()
        if roll < 0.6:
            parent[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif isinstance(parent, dict) and roll < 0.8:
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[f"extra_{rng.randint(0, 9)}"] = copy.deepcopy(rng.choice(ODD_VALUES))
    return body


def cut(body: Any, rng: random.Random) -> str:
    """The body's JSON text cut short: not JSON any more."""
    text = json.dumps(body)
    return text[: rng.randint(0, max(len(text) - 1, 0))]
