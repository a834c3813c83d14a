"""Tool calling through the whole stack with the `openai` client, a Hermes-style chat template
and --tool-call-parser hermes: "required" and a named function always give parseable calls
whose arguments fit their function's schema, the parser reads calls out of a Hermes answer,
streams add up to the whole answers, and what cannot be is a 400 naming it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from tests.integration.conftest import keyed_stack
from tests.integration.hermes_tools import HERMES_TEMPLATE, SCHEMAS, TOOLS
from tests.integration.openai_helpers import async_client, sync_client
from tools.stack import Stack

QUESTIONS = ["What is the weather in Paris?", "Add 2 and 3.", "Hello", "x", "Weather and sums, please."]


@pytest.fixture(scope="module", params=["qwen2"], name="stack")
def _tool_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    args = ["--chat-template", HERMES_TEMPLATE, "--tool-call-parser", "hermes"]
    yield from keyed_stack(request, tokenizer_args=["--api-key", "sk-test-0123", *args])


def _chat(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def _valid(calls) -> None:
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _streamed(chunks: list) -> tuple[str, list[dict], str]:
    """A stream's content, calls (name and arguments added up) and last finish reason."""
    content, calls, reason = "", {}, ""
    for c in chunks:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
        reason = c.choices[0].finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def test_required_and_named_always_give_calls_that_fit_their_schema(stack: Stack) -> None:
    client = async_client(stack)
    named = {"type": "function", "function": {"name": "add"}}

    async def ask(q: str, choice, stream: bool):
        r = await client.chat.completions.create(
            model=stack.model_name, messages=_chat(q), tools=TOOLS, tool_choice=choice, max_tokens=200,
            temperature=0, stream=stream,
        )  # fmt: skip
        return [c async for c in r] if stream else r

    async def run() -> list:
        cases = [(q, c, s) for q in QUESTIONS for c in ("required", named) for s in (False, True)]
        return list(zip(cases, await asyncio.gather(*(ask(*case) for case in cases)), strict=True))

    answers = asyncio.run(run())
    whole = {(q, str(c)): a.choices[0] for (q, c, s), a in answers if not s}
    for (q, choice), answer in whole.items():
        assert answer.finish_reason == "tool_calls" and answer.message.content is None, (q, answer)
        _valid(answer.message.tool_calls)
        if choice != "required":
            assert [c.function.name for c in answer.message.tool_calls] == ["add"]
    for (q, choice, stream), chunks in answers:
        if stream:  # a stream adds up to the whole answer
            content, calls, reason = _streamed(chunks)
            want = whole[(q, str(choice))].message.tool_calls
            assert calls == [{"name": c.function.name, "arguments": c.function.arguments} for c in want]
            assert reason == "tool_calls" and content == ""


def test_the_parser_reads_a_hermes_answer_whole_and_streamed(stack: Stack) -> None:
    """tool_choice auto; the answer written by a grammar, as a model that calls tools would."""
    client = sync_client(stack)
    call = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    answer = f"Let me check.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
    grammar = "root ::= " + json.dumps(answer)
    kw = dict(model=stack.model_name, messages=_chat(QUESTIONS[0]), tools=TOOLS, max_tokens=100, temperature=0)
    whole = client.chat.completions.create(**kw, extra_body={"guided_grammar": grammar})
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and msg.content == "Let me check.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})
    ]
    chunks = list(client.chat.completions.create(**kw, stream=True, extra_body={"guided_grammar": grammar}))
    content, calls, reason = _streamed(chunks)
    assert (content, reason) == ("Let me check.\n", "tool_calls")
    assert calls == [{"name": "get_weather", "arguments": msg.tool_calls[0].function.arguments}]
    pieces = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert len(pieces) > 2 and pieces[0].id and pieces[0].function.name == "get_weather"


def test_auto_with_a_model_that_calls_nothing_and_a_conversation_with_results(stack: Stack) -> None:
    client = sync_client(stack)
    free = client.chat.completions.create(
        model=stack.model_name, messages=_chat("Hello"), tools=TOOLS, max_tokens=12, temperature=0
    )
    assert free.choices[0].message.tool_calls is None and free.choices[0].finish_reason in ("stop", "length")
    history = [
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
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C and snow"},
    ]
    r = client.chat.completions.create(
        model=stack.model_name, messages=history, tools=TOOLS, tool_choice="none", max_tokens=5, temperature=0
    )
    assert r.choices[0].message.tool_calls is None
    one = client.chat.completions.create(
        model=stack.model_name, messages=_chat("Both?"), tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=200, temperature=0,
    )  # fmt: skip
    assert len(one.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize(
    ("kw", "param", "says"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "foo"}}}]}, "tools", "type"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools", "parameters"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
        ({"tool_choice": "required"}, "tool_choice", "no tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", ""),
        ({"functions": [{"name": "f"}]}, "functions", "use tools"),
    ],
)
def test_bad_tools_are_a_400_naming_them(stack: Stack, kw: dict, param: str, says: str) -> None:
    client = sync_client(stack)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=stack.model_name, messages=_chat("hi"), max_tokens=4, extra_body=kw)
    assert e.value.body["param"].startswith(param) and says in e.value.body["message"], e.value.body
    ok = client.chat.completions.create(model=stack.model_name, messages=_chat("hi"), max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")
