"""Anthropic's request bodies: the conversation as the chat template reads it (tool results as
tool messages, tool_use blocks as calls, images as parts), tools and tool_choice as the chat
route's, sampling, and a 400 naming what cannot be."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from services.tokenizer.anthropic.params import CountTokensRequest, MessagesRequest
from services.tokenizer.errors import APIError, describe_validation
from services.tokenizer.openai.tools import tool_plan

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CACHED = {"type": "ephemeral"}
PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


def _turn(role: str, *blocks: dict) -> dict:
    return {"messages": [{"role": role, "content": list(blocks)}]}


def _body(**kw) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **kw}
    return MessagesRequest.model_validate_json(json.dumps(body))


def _refusal(**kw) -> str:
    with pytest.raises(ValidationError) as e:
        _body(**kw)
    return describe_validation(list(e.value.errors()))


def test_a_conversation_with_tools_becomes_the_chat_routes_messages() -> None:
    body = _body(
        system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief.", "cache_control": CACHED}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Oslo?"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "a tool will know", "signature": "s"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "-3 C"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such place", "is_error": True},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ],
    )  # fmt: skip
    call = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    assert body.chat() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "no such place"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert not body.prefill() and body.image_sources() == []


def test_a_final_assistant_turn_is_a_prefill_unless_it_is_empty() -> None:
    begun = _body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}])
    assert begun.prefill() and begun.chat()[-1] == {"role": "assistant", "content": "Hello"}
    empty = _body(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}])
    assert not empty.prefill() and empty.chat() == [{"role": "user", "content": "hi"}]
    called = _body(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        ]
    )
    with pytest.raises(APIError) as e:
        called.check()
    assert e.value.status == 400 and e.value.param == "messages" and "text blocks only" in e.value.message


def test_images_are_parts_where_they_stand_and_sources_named_by_their_block() -> None:
    content = [
        {"type": "text", "text": "Compare "},
        {"type": "image", "source": PNG},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    ]
    body = _body(messages=[{"role": "user", "content": "x"}, {"role": "user", "content": content}])
    parts = [{"type": "text", "text": "Compare "}, {"type": "image"}, {"type": "image"}]
    assert body.chat()[1] == {"role": "user", "content": parts}
    first, second = body.image_sources()
    assert (first.text, first.param, first.bare_base64) == (PNG["data"], "messages.1.content.1.source.data", True)
    url = ("https://example.com/a.png", "messages.1.content.2.source.url", False)
    assert (second.text, second.param, second.bare_base64) == url


def test_tool_choice_maps_onto_the_chat_routes() -> None:
    assert _body(tools=[TOOL]).function_choice() is None  # auto, by default
    anyone = _body(tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert anyone.function_choice() == "required" and anyone.parallel_calls() is False
    named = _body(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    plan = tool_plan(named.function_tools(), named.function_choice(), "", named.parallel_calls())
    assert plan.constraint is not None and json.loads(plan.constraint.text) == TOOL["input_schema"]
    assert plan.tools == [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL["input_schema"]}}]
    none = _body(tools=[TOOL], tool_choice={"type": "none"})
    assert tool_plan(none.function_tools(), none.function_choice(), "", None).tools is None
    auto = _body(tools=[TOOL])
    with pytest.raises(APIError) as e:  # auto reads calls with the server's parser; without one, a 400
        tool_plan(auto.function_tools(), auto.function_choice(), "", auto.parallel_calls())
    assert e.value.param == "tool_choice" and "--tool-call-parser" in e.value.message


def test_sampling_is_anthropics() -> None:
    default = _body().sampling(7, None)
    assert default.do_sample and default.temperature == 1.0 and (default.max_new_tokens, default.seed) == (8, 7)
    greedy = _body(temperature=0, top_p=0.5, top_k=3, stop_sequences=["\n\n"]).sampling(7, None)
    assert not greedy.do_sample and (greedy.top_p, greedy.top_k) == (0.5, 3)
    assert _body(stop_sequences=["\n\n"]).stops() == ["\n\n"]
    assert _body(metadata={"user_id": "u"}, service_tier="auto", cache_control={"type": "ephemeral"}).max_tokens == 8
    assert CountTokensRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"temperature": 1.5}, "temperature: Input should be less than or equal to 1"),
        ({"stop_sequences": [""]}, "stop_sequences: must not contain an empty string"),
        ({"top_logprobs": 2}, "top_logprobs: unknown parameter"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking: not supported by this server"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type: Input should be 'custom'"),
        ({"tools": [{"name": "f", "input_schema": {"type": "foo"}}]}, "tools.0.input_schema: not a JSON schema"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.tool.name: required"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role: Input should be 'user' or 'assistant'"),
        (_turn("user", {"type": "document"}), "Input tag 'document'"),
        (_turn("user", {"type": "tool_use", "id": "t", "name": "f", "input": {}}), "tool_use blocks may not"),
        (_turn("assistant", {"type": "image", "source": PNG}), "image blocks may not be in assistant turns"),
        (_turn("user", {"type": "image", "source": {**PNG, "media_type": "image/bmp"}}), "media_type"),
        (_turn("user", {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}), "content"),
    ],
)  # fmt: skip
def test_what_cannot_be_is_named(change: dict, says: str) -> None:
    assert says in _refusal(**change)
