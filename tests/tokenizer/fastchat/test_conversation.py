"""The conversation template /worker_get_conv_template gives FastChat renders, with
FastChat's own Conversation class, what the model's chat template renders."""

from __future__ import annotations

from typing import Any

import pytest
from fastchat.conversation import Conversation, SeparatorStyle

from services.tokenizer.fastchat.conversation import conversation
from services.tokenizer.tokenization import Tokenization

# Qwen2's template: a default system message when none is given
QWEN2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 3's: headers, content trimmed, BOS written by the template
LLAMA3 = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
# Llama 2's: the system message inside the first user turn; FastChat's styles cannot say it
LLAMA2 = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'] "
    "+ ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>' + message['content'] + '<</SYS>>' }}"
    "{% else %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}"
)

CHATS = [
    [("user", "Hello there")],
    [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a {story}.")],
]


def fastchat_prompt(conv: dict[str, Any], system: str | None, chat: list[tuple[str, str]]) -> str:
    """What FastChat's API server sends the worker (fastchat/serve/openai_api_server.py)."""
    c = Conversation(
        name=conv["name"],
        system_template=conv["system_template"],
        system_message=conv["system_message"],
        roles=conv["roles"],
        messages=[],
        offset=conv["offset"],
        sep_style=SeparatorStyle(conv["sep_style"]),
        sep=conv["sep"],
        sep2=conv["sep2"],
        stop_str=conv["stop_str"],
        stop_token_ids=conv["stop_token_ids"],
    )
    if system is not None:
        c.set_system_message(system)
    for role, content in chat:
        c.append_message(c.roles[0] if role == "user" else c.roles[1], content)
    c.append_message(c.roles[1], None)
    return c.get_prompt()


def model_prompt(tok: Tokenization, system: str | None, chat: list[tuple[str, str]]) -> str:
    """The model's chat template, less the BOS the worker's tokenizer adds itself."""
    messages = ([] if system is None else [{"role": "system", "content": system}]) + [
        {"role": r, "content": c} for r, c in chat
    ]
    text = tok.render_chat(messages)
    bos = tok.hf.bos_token
    return text.removeprefix(bos) if bos and tok.hf.encode("x")[0] == tok.hf.bos_token_id else text


@pytest.fixture(params=["llama", "qwen2"])
def tok(request: pytest.FixtureRequest, tiny_models: dict[str, str]) -> Tokenization:
    return Tokenization(tiny_models[request.param], 1)


@pytest.mark.parametrize("chat", CHATS)
def test_a_template_without_a_default_system_message(tok: Tokenization, chat: list[tuple[str, str]]) -> None:
    """The tiny models' ChatML writes no system block without a system message; FastChat's
    always does, so its chat without one is the model's with an empty one."""
    conv = conversation(tok, "tiny")
    assert conv["sep_style"] == SeparatorStyle.NO_COLON_SINGLE and conv["system_message"] == ""
    assert fastchat_prompt(conv, "Be brief.", chat) == model_prompt(tok, "Be brief.", chat)
    assert fastchat_prompt(conv, None, chat) == model_prompt(tok, "", chat)


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("template", [QWEN2, LLAMA3])
def test_a_template_with_a_default_system_message_or_none_is_matched_exactly(
    tiny_models: dict[str, str], template: str, chat: list[tuple[str, str]]
) -> None:
    tok = Tokenization(tiny_models["llama"], 1)
    tok.hf.chat_template = template
    conv = conversation(tok, "m")
    assert fastchat_prompt(conv, "Be brief.", chat) == model_prompt(tok, "Be brief.", chat)
    if template == QWEN2:
        assert conv["system_message"] == "You are a helpful assistant."
        assert fastchat_prompt(conv, None, chat) == model_prompt(tok, None, chat)
    else:  # Llama 3 writes no system block without a system message either
        assert fastchat_prompt(conv, None, chat) == model_prompt(tok, "", chat)


def test_a_template_that_does_not_fit_gets_a_plain_one(tiny_models: dict[str, str]) -> None:
    tok = Tokenization(tiny_models["llama"], 1)
    tok.hf.chat_template = LLAMA2
    conv = conversation(tok, "m")
    assert conv["sep_style"] == SeparatorStyle.ADD_COLON_SINGLE and conv["roles"] == ["USER", "ASSISTANT"]
    tok.hf.chat_template = None
    assert conversation(tok, "m")["roles"] == ["USER", "ASSISTANT"]  # no template at all
