"""tools and tool_choice: what the template is given, the grammar of a required or named call,
and a 400 naming tools or tool_choice for what cannot be."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from pydantic import ValidationError

from services.tokenizer.errors import APIError, describe_validation
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.tool_calls import HermesReader, NamedReader
from services.tokenizer.openai.tools import tool_plan
from services.worker.grammar import json_grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
ADD = {"type": "function", "function": {"name": "add"}}  # no parameters: takes none


def _body(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


def _plan(choice=None, parser: str = "hermes", parallel: bool | None = None, tools=(WEATHER, ADD)):
    body = _body(tools=list(tools), **({"tool_choice": choice} if choice is not None else {}))
    return tool_plan(body.tools, body.tool_choice, parser, parallel)


def _accepts(schema_text: str, output: str) -> bool:
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(_INFO).compile_grammar(json_grammar(schema_text)))
    return matcher.accept_string(output) and matcher.is_completed()


_INFO = xgr.TokenizerInfo([chr(c) for c in range(32, 127)])  # a character per token: any text


def test_auto_renders_the_tools_and_reads_with_the_parser() -> None:
    plan = _plan()
    assert plan.tools == [WEATHER, ADD] and plan.constraint is None
    assert isinstance(plan.reader(), HermesReader)
    assert _plan("none").tools is None and _plan("none").reader is None


def test_required_is_a_grammar_of_calls_with_valid_arguments() -> None:
    plan = _plan("required")
    assert plan.tools == [WEATHER, ADD] and plan.constraint.kind == "json_schema"
    text = plan.constraint.text
    assert _accepts(text, '[{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}]')
    assert _accepts(text, '[{"name": "add", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "x"}}]')
    assert not _accepts(text, '[{"name": "get_weather", "parameters": {"unit": "c"}}]')  # city is required
    assert not _accepts(text, '[{"name": "nope", "parameters": {}}]')
    assert not _accepts(text, "[]")
    one = _plan("required", parallel=False).constraint.text
    assert not _accepts(one, '[{"name": "add", "parameters": {}}, {"name": "add", "parameters": {}}]')


def test_a_named_function_is_a_grammar_of_its_arguments() -> None:
    plan = _plan({"type": "function", "function": {"name": "get_weather"}})
    assert json.loads(plan.constraint.text) == WEATHER["function"]["parameters"]
    reader = plan.reader()
    assert isinstance(reader, NamedReader) and reader.name == "get_weather"
    assert json.loads(_plan({"type": "function", "function": {"name": "add"}}).constraint.text)["type"] == "object"


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"choice": "auto", "parser": ""}, "--tool-call-parser"),
        ({"choice": {"type": "function", "function": {"name": "absent"}}}, "no function named 'absent'"),
        ({"choice": "required", "tools": ()}, "there are no tools"),
        ({"tools": (WEATHER, WEATHER)}, "two functions have the same name"),
    ],
)
def test_what_cannot_be_is_a_400_naming_it(kw: dict, says: str) -> None:
    with pytest.raises(APIError) as e:
        _plan(**kw)
    assert e.value.status == 400 and says in e.value.message and e.value.param in ("tools", "tool_choice")


@pytest.mark.parametrize(
    ("tool", "where"),
    [
        ({"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}, "tools.0.function.parameters"),
        (
            {"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": 5}}}},
            "tools.0.function.parameters",
        ),
        ({"type": "function", "function": {"name": "f", "parameters": {"required": "a"}}}, "parameters"),
        ({"type": "function", "function": {"name": "bad name!"}}, "tools.0.function.name"),
        ({"type": "retrieval"}, "tools.0.type"),
    ],
)
def test_malformed_tools_are_named(tool: dict, where: str) -> None:
    with pytest.raises(ValidationError) as e:
        _body(tools=[tool])
    assert where in describe_validation(e.value.errors())


def test_history_with_calls_reaches_the_template_with_arguments_as_objects() -> None:
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"},
    ]
    chat = _body(messages=messages, tools=[WEATHER]).chat()
    assert chat[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert chat[2] == {"role": "tool", "content": "-3 C", "tool_call_id": "call_1"}
