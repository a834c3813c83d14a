"""POST /v1/messages and /v1/messages/count_tokens through the stack with the real `anthropic`
client (its x-api-key header), a Hermes-style chat template and --tool-call-parser hermes: the
greedy text the chat route gives for the same rendered prompt, streams in Anthropic's event
order, stop sequences, max_tokens, a prefill continued, tool_use blocks, and bad requests
answered in Anthropic's error shape while the server serves on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import pytest

from tests.integration.conftest import keyed_stack
from tests.integration.hermes_tools import HERMES_TEMPLATE, SCHEMAS, WEATHER
from tests.integration.openai_helpers import KEY, sync_client
from tools.stack import Stack

SYSTEM = "Answer briefly."
QUESTION = "What is the capital of France?"
GREEDY = {"temperature": 0}  # the client's create() no longer takes sampling parameters; the API does
TOOL = {
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": SCHEMAS["get_weather"],
}


@pytest.fixture(scope="module", params=["qwen2"], name="stack")
def _anthropic_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    args = ["--chat-template", HERMES_TEMPLATE, "--tool-call-parser", "hermes"]
    yield from keyed_stack(request, tokenizer_args=["--api-key", KEY, *args])


def _client(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0, timeout=60)


def _greedy(stack: Stack, **kw) -> dict:
    """messages.create's (and stream's) arguments for a greedy answer from the served model."""
    return {"model": stack.model_name, "extra_body": GREEDY, **kw}


def _chat(stack: Stack, messages: list[dict], max_tokens: int, **kw):
    r = sync_client(stack).chat.completions.create(
        model=stack.model_name, messages=messages, max_tokens=max_tokens, temperature=0, **kw
    )
    return r.choices[0], r.usage


def _events(stack: Stack, body: dict) -> list[tuple[str, dict]]:
    """A stream's (event name, data) pairs, ping included (the client skips pings)."""
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", stack.url + "/v1/messages", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for chunk in text.strip().split("\n\n"):
        name_line, data_line = chunk.split("\n")
        out.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return out


def test_greedy_text_and_counts_equal_the_chat_routes(stack: Stack) -> None:
    client = _client(stack)
    choice, use = _chat(stack, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}], 8)
    msgs = [{"role": "user", "content": QUESTION}]
    m = client.messages.create(**_greedy(stack, system=SYSTEM, messages=msgs, max_tokens=8))
    assert m.id.startswith("msg_") and (m.type, m.role, m.model) == ("message", "assistant", stack.model_name)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == choice.message.content
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[choice.finish_reason]
    assert m.usage.output_tokens == use.completion_tokens and m.usage.cache_creation_input_tokens == 0
    # input_tokens are the prompt's tokens not read from the prompt cache, as Anthropic counts them
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == use.prompt_tokens
    blocks = [
        {"type": "text", "text": "Answer "},
        {"type": "text", "text": "briefly.", "cache_control": {"type": "ephemeral"}},
    ]
    again = client.messages.create(**_greedy(stack, system=blocks, messages=msgs, max_tokens=8))
    assert again.content[0].text == m.content[0].text
    assert again.usage.cache_read_input_tokens == use.prompt_tokens - 1  # the same prompt: the cache held it
    counted = client.messages.count_tokens(model=stack.model_name, system=blocks, messages=msgs)
    assert counted.input_tokens == use.prompt_tokens
    short = client.messages.create(**_greedy(stack, system=SYSTEM, messages=msgs, max_tokens=2))
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_a_stream_sends_anthropics_events_and_adds_up_to_the_answer(stack: Stack) -> None:
    body = {"model": stack.model_name, "system": SYSTEM, "max_tokens": 8}
    body["messages"] = [{"role": "user", "content": QUESTION}]
    whole = _client(stack).messages.create(**body, extra_body=GREEDY)
    events = _events(stack, {**body, **GREEDY, "stream": True})
    names = [name for name, _ in events]
    assert all(data["type"] == name for name, data in events)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["id"].startswith("msg_")
    assert start["usage"]["input_tokens"] + start["usage"]["cache_read_input_tokens"] == _counted(stack, body)
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert all(d["type"] == "text_delta" for d in deltas)
    assert "".join(d["text"] for d in deltas) == whole.content[0].text
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert end["usage"]["output_tokens"] == whole.usage.output_tokens
    with _client(stack).messages.stream(**body, extra_body=GREEDY) as s:  # the client's own accumulation agrees
        assert "".join(s.text_stream) == whole.content[0].text
        assert s.get_final_message().to_dict()["content"] == whole.to_dict()["content"]


def _counted(stack: Stack, body: dict) -> int:
    kw = {k: body[k] for k in ("model", "system", "messages", "tools", "tool_choice") if k in body}
    return _client(stack).messages.count_tokens(**kw).input_tokens


def test_stop_sequences_and_a_prefill(stack: Stack) -> None:
    client = _client(stack)
    msgs = [{"role": "user", "content": QUESTION}]
    text = client.messages.create(**_greedy(stack, messages=msgs, max_tokens=12)).content[0].text
    k = next(i for i in range(1, len(text) - 1) if text[i : i + 2].strip())
    stop = text[k : k + 2]
    kw = _greedy(stack, messages=msgs, max_tokens=12, stop_sequences=["#never#", stop])
    m = client.messages.create(**kw)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    assert m.content[0].text == text[: text.index(stop)]
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.to_dict()["content"] == m.to_dict()["content"]
    # a final assistant turn is the answer's start: as the chat route's continue_final_message
    prefill = [*msgs, {"role": "assistant", "content": "The capital"}]
    p = client.messages.create(**_greedy(stack, messages=prefill, max_tokens=6))
    flags = {"add_generation_prompt": False, "continue_final_message": True}
    choice, use = _chat(stack, prefill, 6, extra_body=flags)
    assert p.content[0].text == choice.message.content
    assert client.messages.count_tokens(model=stack.model_name, messages=prefill).input_tokens == use.prompt_tokens


def test_a_named_or_any_tool_gives_tool_use_blocks_whole_and_streamed(stack: Stack) -> None:
    client = _client(stack)
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any", "disable_parallel_tool_use": True}):
        kw = _greedy(stack, messages=msgs, tools=[TOOL], tool_choice=choice, max_tokens=80)
        m = client.messages.create(**kw)
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"], m
        call = m.content[0]
        assert call.id.startswith("toolu_") and call.name == "get_weather"
        jsonschema.validate(call.input, SCHEMAS["get_weather"])
        with client.messages.stream(**kw) as s:
            pieces = [e.partial_json for e in s if e.type == "input_json"]
            final = s.get_final_message()
        assert final.content[0].input == call.input and final.stop_reason == "tool_use"
        assert json.loads("".join(pieces)) == call.input


def test_a_conversation_with_tool_use_and_tool_result_renders_as_the_chat_routes(stack: Stack) -> None:
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "-3 C and snow"}]},
    ]  # fmt: skip
    openai_history = [
        history[0],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        ]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C and snow"},
    ]  # fmt: skip
    choice, use = _chat(stack, openai_history, 6, tools=[WEATHER])
    m = _client(stack).messages.create(**_greedy(stack, messages=history, tools=[TOOL], max_tokens=6))
    assert "".join(b.text for b in m.content) == (choice.message.content or "")
    assert _counted(stack, {"model": stack.model_name, "messages": history, "tools": [TOOL]}) == use.prompt_tokens
    # tool_choice none leaves the tools out of the prompt, as on the chat route
    _, bare = _chat(stack, openai_history, 1)
    none = {"model": stack.model_name, "messages": history, "tools": [TOOL], "tool_choice": {"type": "none"}}
    assert _counted(stack, none) == bare.prompt_tokens


def _post(stack: Stack, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"x-api-key": key} if key else {}
    return httpx.post(stack.url + path, json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("change", "status", "kind", "says"),
    [
        ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens: required"),
        ({"messages": [{"role": "system", "content": "hi"}]}, 400, "invalid_request_error", "messages.0.role"),
        ({"top_logprobs": 2}, 400, "invalid_request_error", "top_logprobs: unknown parameter"),
        ({"model": "claude-x"}, 404, "not_found_error", "claude-x"),
        ({"thinking": {"type": "enabled", "budget_tokens": 64}}, 400, "invalid_request_error", "thinking"),
        ({"temperature": 1.5}, 400, "invalid_request_error", "temperature"),
        ({"tool_choice": {"type": "any"}}, 400, "invalid_request_error", "no tools"),
        ({"max_tokens": 10**6}, 400, "invalid_request_error", "max_tokens"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}]},
            400,
            "invalid_request_error",
            "text-only",
        ),
    ],
)  # fmt: skip
def test_bad_requests_get_anthropics_error_shape(stack: Stack, change: dict, status: int, kind: str, says: str) -> None:
    body = {"model": stack.model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **change}
    r = _post(stack, "/v1/messages", {k: v for k, v in body.items() if v is not None})
    assert r.status_code == status and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == kind and says in r.json()["error"]["message"], r.text


def test_errors_by_route_and_the_server_serves_on(stack: Stack) -> None:
    body = {"model": stack.model_name, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    unkeyed = _post(stack, "/v1/messages", body, key=None)
    assert unkeyed.status_code == 401 and unkeyed.json()["error"]["type"] == "authentication_error"
    count = _post(stack, "/v1/messages/count_tokens", {**body, "max_tokens": 2})
    assert count.status_code == 400 and count.json()["error"]["message"] == "max_tokens: unknown parameter"
    with pytest.raises(anthropic.NotFoundError) as e:
        _client(stack).messages.create(**{**body, "model": "nope"})
    assert e.value.body["error"]["type"] == "not_found_error"
    openai_bad = httpx.post(
        stack.url + "/v1/chat/completions", json={**body, "max_tokens": 0}, headers={"x-api-key": KEY}, timeout=30
    )
    assert openai_bad.status_code == 400 and openai_bad.json()["error"]["param"] == "max_tokens"  # OpenAI's shape
    ok = _client(stack).messages.create(**body)
    assert ok.stop_reason in ("end_turn", "max_tokens") and ok.usage.output_tokens >= 1
