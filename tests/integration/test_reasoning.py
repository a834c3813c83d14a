"""--reasoning-parser through the stack with the `openai` client: deepseek_r1 reads an answer
that never closes its thinking as all thinking, whole and streamed (and with the `anthropic`
client, as a thinking block); a format with it needs </think> as one token, which the tiny
tokenizer does not have: a 400 that says so."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.integration.conftest import keyed_stack
from tests.integration.openai_helpers import KEY, chat_ids, sync_client
from tools.stack import Stack

CHAT = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module", params=["qwen2"], name="stack")
def _reasoning_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    yield from keyed_stack(request, tokenizer_args=["--api-key", KEY, "--reasoning-parser", "deepseek_r1"])


def test_thinking_goes_to_reasoning_content_whole_and_streamed(stack: Stack) -> None:
    client = sync_client(stack)
    plain = client.completions.create(
        model=stack.model_name, prompt=chat_ids(stack.model_dir, CHAT), max_tokens=16, temperature=0
    )
    kw = dict(model=stack.model_name, messages=CHAT, max_tokens=16, temperature=0)
    whole = client.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert msg.reasoning_content == plain.choices[0].text and not msg.content  # no </think>: all thinking
    chunks = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    thinking = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert thinking == msg.reasoning_content
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_a_format_after_thinking_needs_the_end_token(stack: Stack) -> None:
    client = sync_client(stack)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=stack.model_name, messages=CHAT, max_tokens=8, response_format={"type": "json_object"}
        )
    assert "</think> to be one token" in e.value.body["message"]


def test_anthropic_messages_give_the_thinking_its_own_block(stack: Stack) -> None:
    """/v1/messages: the thinking is a thinking block, whole and streamed; a tool held to its
    schema after the thinking needs </think> as one token too."""
    client = anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0)
    kw = dict(model=stack.model_name, messages=CHAT, max_tokens=16, extra_body={"temperature": 0})
    whole = client.messages.create(**kw)
    want = sync_client(stack).chat.completions.create(
        model=stack.model_name, messages=CHAT, max_tokens=16, temperature=0
    )
    assert [(b.type, b.thinking, b.signature) for b in whole.content] == [
        ("thinking", want.choices[0].message.reasoning_content, "")
    ]
    with client.messages.stream(**kw) as s:
        thinking = "".join(e.thinking for e in s if e.type == "thinking")
    assert thinking == whole.content[0].thinking
    tool = {"name": "f", "input_schema": {"type": "object"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(**kw, tools=[tool], tool_choice={"type": "any"})
    assert e.value.body["error"]["type"] == "invalid_request_error" and "</think>" in e.value.body["error"]["message"]
