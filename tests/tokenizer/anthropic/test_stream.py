"""One answer's Anthropic events from the pipeline's text items: the order (a ping after the first
block's start), text, thinking and tool_use blocks with their deltas adding up to the whole
answer's content, the stop sequence found again, and a failure ending the stream with an
error event."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.tokenizer.anthropic.reply import Blocks, Shell
from services.tokenizer.anthropic.stream import MessageStream
from services.tokenizer.metrics import FrontMetrics
from services.tokenizer.openai.chat_reader import ChatReader
from services.tokenizer.openai.reasoning import ReasoningReader
from services.tokenizer.openai.tool_calls import HermesReader, NamedReader
from services.tokenizer.tokenization import Tokenization
from shared.messages import ERR_DEADLINE, FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, TextItem


@pytest.fixture(scope="module")
def tok(tiny_llama: str) -> Tokenization:
    return Tokenization(tiny_llama, 1)


def _run(stream: MessageStream, items: list[TextItem]) -> list[tuple[str, dict]]:
    """Every event as (event name, data), each checked to carry its name as its type."""

    async def run() -> list[bytes]:
        out = [stream.start(cached=3)]
        for item in items:
            chunks, over = await stream.step(item)
            out += chunks
            if over:
                break
        return out

    events = []
    for chunk in asyncio.run(run()):
        name, data = chunk.decode().removesuffix("\n\n").split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
        assert events[-1][1]["type"] == events[-1][0]
    return events


def _stream(tok: Tokenization, reader: ChatReader, stops: tuple[str, ...] = (), metrics: FrontMetrics | None = None):
    return MessageStream(Shell(tok, "m", 10, list(stops)), reader, metrics or FrontMetrics("m"), "/v1/messages")


def test_text_streams_in_anthropics_order(tok: Tokenization) -> None:
    items = [TextItem("r", "Hel", [1]), TextItem("r", "lo", [2], finish_reason=FINISH_LENGTH, output_tokens=2)]
    events = _run(_stream(tok, ChatReader(None, None)), items)
    assert [n for n, _ in events] == [
        "message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[0][1]["message"]
    assert (
        start["content"] == []
        and start["usage"]["input_tokens"] == 7
        and start["usage"]["cache_read_input_tokens"] == 3
    )
    assert [d["delta"] for n, d in events if n == "content_block_delta"] == [
        {"type": "text_delta", "text": "Hel"},
        {"type": "text_delta", "text": "lo"},
    ]
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None} and end["usage"] == {"output_tokens": 2}


def test_thinking_then_text_are_two_blocks(tok: Tokenization) -> None:
    reader = ChatReader(ReasoningReader("deepseek_r1"), None)
    items = [
        TextItem("r", "hmm, Paris"),
        TextItem("r", "</think>\n\nParis."),
        TextItem("r", "", finish_reason=FINISH_STOP),
    ]
    events = _run(_stream(tok, reader), items)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""}]
    assert [(n, d["index"]) for n, d in events if n in ("content_block_start", "content_block_stop")] == [
        ("content_block_start", 0), ("content_block_stop", 0), ("content_block_start", 1), ("content_block_stop", 1),
    ]  # fmt: skip
    thinking = "".join(d["delta"].get("thinking", "") for n, d in events if n == "content_block_delta")
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert (thinking, text) == ("hmm, Paris", "Paris.") and events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_a_named_call_is_one_tool_use_block_whole_and_streamed(tok: Tokenization) -> None:
    pieces = ['{"city": ', '"Oslo"}']
    items = [TextItem("r", pieces[0]), TextItem("r", pieces[1], finish_reason=FINISH_STOP, output_tokens=5)]
    events = _run(_stream(tok, ChatReader(None, NamedReader("get_weather"))), items)
    (start,) = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert start["type"] == "tool_use" and start["id"].startswith("toolu_") and start["name"] == "get_weather"
    assert start["input"] == {}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "input_json_delta" for d in deltas) and "".join(
        d["partial_json"] for d in deltas
    ) == "".join(pieces)
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    whole = Blocks()
    reader = ChatReader(None, NamedReader("get_weather"))
    whole.feed(reader.feed("".join(pieces)) + reader.finish())
    assert [(b["type"], b["name"], b["input"]) for b in whole.content()] == [
        ("tool_use", "get_weather", {"city": "Oslo"})
    ]
    cut = Blocks()
    cut.feed(ChatReader(None, NamedReader("f")).feed('{"city": "Os'))
    assert cut.content()[0]["input"] == {}  # cut short by max_tokens: not an object yet


def test_text_then_a_parsed_call_are_a_text_and_a_tool_use_block(tok: Tokenization) -> None:
    answer = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    items = [TextItem("r", answer[i : i + 7]) for i in range(0, len(answer), 7)]
    items.append(TextItem("r", "", finish_reason=FINISH_STOP))
    events = _run(_stream(tok, ChatReader(None, HermesReader())), items)
    starts = [(d["index"], d["content_block"]["type"]) for n, d in events if n == "content_block_start"]
    assert starts == [(0, "text"), (1, "tool_use")]
    assert [n for n, _ in events].count("content_block_stop") == 2 and events[-2][1]["delta"][
        "stop_reason"
    ] == "tool_use"
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    arguments = "".join(d["delta"].get("partial_json", "") for n, d in events if n == "content_block_delta")
    assert text == "Let me check.\n" and json.loads(arguments) == {"city": "Paris"}


def test_the_stop_sequence_is_found_again_past_the_text(tok: Tokenization) -> None:
    ids = tok.hf("Hello world. Bye", add_special_tokens=False)["input_ids"]
    cut = tok.hf.decode(ids).index(".")  # the detokenizer sent the text before the stop string
    items = [TextItem("r", tok.hf.decode(ids)[:cut], ids, finish_reason=FINISH_STOP, output_tokens=len(ids))]
    events = _run(_stream(tok, ChatReader(None, None), stops=("zz", ". B")), items)
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": ". B"}


def test_a_failure_after_the_start_ends_with_an_error_event_and_is_counted(tok: Tokenization) -> None:
    metrics = FrontMetrics("m")
    failed = TextItem("r", "", finish_reason=FINISH_ERROR, error="deadline exceeded", error_kind=ERR_DEADLINE)
    events = _run(_stream(tok, ChatReader(None, None), metrics=metrics), [TextItem("r", "Hi", [1]), failed])
    assert [n for n, _ in events][-3:] == ["ping", "content_block_delta", "error"]
    error = {"type": "timeout_error", "message": "generation failed: deadline exceeded"}
    assert events[-1][1] == {"type": "error", "error": error}
    counted = 'lightstream_front_request_errors_total{code="504",model_name="m",route="/v1/messages"} 1.0'
    assert counted in metrics.render().decode().splitlines()


def test_an_empty_answer_has_no_block_and_still_a_ping(tok: Tokenization) -> None:
    events = _run(_stream(tok, ChatReader(None, None)), [TextItem("r", "", [2], finish_reason=FINISH_STOP)])
    assert [n for n, _ in events] == ["message_start", "ping", "message_delta", "message_stop"]
