"""The tool-call and reasoning readers on fixed model outputs: the whole answer, and the same
answer streamed in pieces of every size, give the same message; a stream sends a call's id
and name first, then its arguments in pieces."""

from __future__ import annotations

import json

import pytest

from services.tokenizer.openai.chat_reader import ChatReader, message
from services.tokenizer.openai.reasoning import ReasoningReader
from services.tokenizer.openai.text_scan import ValueScan
from services.tokenizer.openai.tool_calls import NamedReader, parser_reader, required_reader

HERMES = (
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\\"is", "days": [1, {"a": 2}]}}\n'
    '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
)
LLAMA3 = '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1}}'


def _call(name: str, arguments: str) -> dict:
    return {"name": name, "arguments": arguments}


def _read(reader: ChatReader, text: str, piece: int) -> list[dict]:
    deltas = []
    for i in range(0, len(text), piece):
        deltas += reader.feed(text[i : i + piece])
    return deltas + reader.finish()


def _message(make, text: str, piece: int, reasoning: bool = False) -> dict:
    msg = message(_read(make(), text, piece), with_reasoning=reasoning)
    for c in msg.get("tool_calls", []):
        assert c["id"].startswith("call_") and c["type"] == "function"
        del c["id"], c["type"]
    msg["tool_calls"] = [c["function"] for c in msg.get("tool_calls", [])]
    return msg


CASES = [
    # (parser, output, content, calls)
    (
        "hermes",
        HERMES,
        "Let me look.\n",
        [_call("get_weather", '{"city": "Par\\"is", "days": [1, {"a": 2}]}'), _call("add", '{"a": 1, "b": 2}')],
    ),
    ("hermes", "No tools: a < b and <tool> too.", "No tools: a < b and <tool> too.", []),
    ("hermes", '<tool_call>{"arguments": {"x": 1}, "name": "g"}</tool_call>', None, [_call("g", '{"x": 1}')]),
    ("hermes", "<tool_call>not json</tool_call> then", "<tool_call>not json</tool_call> then", []),
    ("hermes", '<tool_call>{"name": "h", "arguments": {"x": 1', None, [_call("h", '{"x": 1')]),  # cut short
    ("hermes", '<tool_call>{"name": "h", "arguments": 5}</tool_call>\nDone.', "Done.", [_call("h", "5")]),
    ("hermes", "Ends in a partial tag <tool_ca", "Ends in a partial tag <tool_ca", []),
    ("llama3_json", LLAMA3, None, [_call("get_weather", '{"city": "Paris"}'), _call("add", '{"a": 1}')]),
    ("llama3_json", '<|python_tag|>{"name": "x", "parameters": {}}', None, [_call("x", "{}")]),
    ("llama3_json", 'Hello {"name": "x"}', 'Hello {"name": "x"}', []),
    ("llama3_json", '{"x": 1} is JSON', '{"x": 1} is JSON', []),
]


@pytest.mark.parametrize(("parser", "output", "content", "calls"), CASES)
def test_parsers_read_the_same_whole_and_in_pieces(parser: str, output: str, content, calls: list) -> None:
    for piece in (1, 2, 3, 7, len(output)):
        msg = _message(lambda: ChatReader(None, parser_reader(parser)), output, piece)
        assert msg["content"] == content and msg["tool_calls"] == calls, (piece, msg)


def test_a_stream_names_the_call_first_then_sends_its_arguments_in_pieces() -> None:
    reader = ChatReader(None, parser_reader("hermes"))
    deltas = _read(reader, HERMES, 4)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    first = calls[0]
    assert first["index"] == 0 and first["function"]["name"] == "get_weather" and first["id"].startswith("call_")
    pieces = [c["function"]["arguments"] for c in calls if c["index"] == 0]
    assert len(pieces) > 3 and json.loads("".join(pieces))["city"] == 'Par"is'
    assert all("id" not in c for c in calls[1:] if c["index"] == 0)
    assert reader.called


def test_parallel_false_keeps_the_first_call_and_required_and_named_read_grammar_output() -> None:
    msg = _message(lambda: ChatReader(None, parser_reader("hermes"), parallel=False), HERMES, 5)
    assert [c["name"] for c in msg["tool_calls"]] == ["get_weather"]
    array = '[{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    msg = _message(lambda: ChatReader(None, required_reader()), array, 3)
    assert msg["tool_calls"] == [_call("add", '{"a": 1, "b": 2}'), _call("get_weather", '{"city": "Oslo"}')]
    assert msg["content"] is None
    msg = _message(lambda: ChatReader(None, NamedReader("add")), '{"a": 1, "b": 2}', 2)
    assert msg["tool_calls"] == [_call("add", '{"a": 1, "b": 2}')] and msg["content"] is None


@pytest.mark.parametrize(
    ("parser", "output", "thinking", "answer"),
    [
        ("deepseek_r1", "Let me think.\nOK.\n</think>\n\nThe answer is 4.", "Let me think.\nOK.\n", "The answer is 4."),
        ("deepseek_r1", "<think>Hm.</think>Four.", "Hm.", "Four."),
        ("deepseek_r1", "Still thinking when cut", "Still thinking when cut", None),
        ("qwen3", "<think>\nHm, 2+2.\n</think>\n\nFour.", "\nHm, 2+2.\n", "Four."),
        ("qwen3", "Four, without thinking.", None, "Four, without thinking."),
        ("qwen3", "<thin", None, "<thin"),
        ("qwen3", "<think>cut short </thi", "cut short </thi", None),
    ],
)
def test_reasoning_is_read_apart_from_the_answer(parser: str, output: str, thinking, answer) -> None:
    for piece in (1, 2, 5, len(output)):
        msg = _message(lambda: ChatReader(ReasoningReader(parser), None), output, piece, reasoning=True)
        assert (msg["reasoning_content"], msg["content"] or None) == (thinking, answer), piece


def test_a_thinking_model_that_calls_a_tool() -> None:
    output = "<think>The user wants weather.</think>\n" + HERMES
    msg = _message(lambda: ChatReader(ReasoningReader("qwen3"), parser_reader("hermes")), output, 3, reasoning=True)
    assert msg["reasoning_content"] == "The user wants weather."
    assert msg["content"] == "Let me look.\n" and [c["name"] for c in msg["tool_calls"]] == ["get_weather", "add"]


@pytest.mark.parametrize(
    ("text", "taken"),
    [('{"a": "}"} tail', 10), ("[1, [2]], x", 8), ('"a\\"b" x', 6), ("12, 3", 2), ("  true}", 6), ('{"a": 1', 7)],
)
def test_a_json_value_ends_where_it_closes(text: str, taken: int) -> None:
    for piece in (1, len(text)):
        scan, took = ValueScan(), 0
        for i in range(0, len(text), piece):
            n = scan.take(text[i : i + piece])
            took += n
            if n < len(text[i : i + piece]):
                break
        assert took == taken, piece
