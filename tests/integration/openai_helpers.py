"""What the OpenAI API tests share: a stack that asks for API keys, clients with the key,
prompts and chats, and a chat's token ids as the server renders them."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests import hf_reference
from tests.integration.conftest import keyed_stack
from tools.stack import Stack

KEY = "sk-test-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。",
    "Once upon a time there was a small town by the sea. " * 3,
    "Emoji: 😀 🚀 and more",
    "x",
]
CHATS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is two plus two?"}],
    [
        {"role": "user", "content": "Tell me about the sea."},
        {"role": "assistant", "content": "The sea is wide."},
        {"role": "user", "content": [{"type": "text", "text": "More, "}, {"type": "text", "text": "please."}]},
    ],
]


@pytest.fixture(scope="module", params=["llama", "qwen2"], name="stack")
def _stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One stack per tiny model that takes either of two API keys. Test modules import this
    fixture; each starts its own."""
    yield from keyed_stack(request, tokenizer_args=["--api-key", "other", "--api-key", KEY])


def async_client(stack: Stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def sync_client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def flat_chat(messages: list[dict]) -> list[dict]:
    """Content parts joined, as the server hands them to the template."""
    out = []
    for m in messages:
        c = m["content"]
        out.append({**m, "content": c if isinstance(c, str) else "".join(p["text"] for p in c)})
    return out


def chat_ids(model_dir: str, messages: list[dict]) -> list[int]:
    tok = hf_reference.tokenizer(model_dir)
    text = tok.apply_chat_template(flat_chat(messages), tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]
