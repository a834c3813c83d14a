"""--chat-template, --tokenizer and chat_template_kwargs through the stack: the template given
on the command line renders the chat, its variables come from the request, and the tokenizer
comes from its own directory."""

from __future__ import annotations

import os
import shutil

import httpx
import openai

from tests import hf_reference
from tests.integration.conftest import start_stack
from tools.redis_server import RedisServer

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}{% if loud %} LOUDLY{% endif %} | {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_chat_template_from_a_file_with_request_variables(tiny_llama: str, redis_server: RedisServer, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(src := os.path.join(tiny_llama, name)):
            shutil.copy(src, tokenizer / name)
    flags = ["--chat-template", str(template), "--tokenizer", str(tokenizer)]
    stack = start_stack(
        tiny_llama, redis_server, str(tmp_path / "logs"), tokenizer_args=flags, detokenizer_args=flags[2:]
    )
    try:
        messages = [{"role": "user", "content": "hello there"}]
        tok = hf_reference.tokenizer(tiny_llama)
        for loud in (False, True):
            text = "<user> hello there" + (" LOUDLY" if loud else "") + " | <assistant>"
            r = httpx.post(
                stack.url + "/tokenize",
                json={"messages": messages, "chat_template_kwargs": {"loud": loud}},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            assert r.json()["tokens"] == tok(text, add_special_tokens=False)["input_ids"]
            client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none")
            out = client.chat.completions.create(
                model=client.models.list().data[0].id,
                messages=messages,
                max_tokens=5,
                temperature=0,
                extra_body={"chat_template_kwargs": {"loud": loud}, "ignore_eos": True},
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert out.usage.prompt_tokens == len(ids)
            want = hf_reference.greedy(tiny_llama, ids, 5, eos=False)
            assert out.choices[0].message.content == tok.decode(want, skip_special_tokens=True)
        bad = httpx.post(
            stack.url + "/v1/chat/completions",
            json={"model": "x", "messages": messages, "chat_template_kwargs": {"tokenize": True}},
            timeout=30,
        )
        assert bad.status_code == 400 and "chat_template_kwargs" in bad.text
    finally:
        stack.stop()
