"""Text <-> tokens for the front end, off the event loop.

Encoding runs in a small thread pool (the Rust tokenizer releases the GIL), so a long
prompt never blocks other requests' streams.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import re
from typing import Any

from tokenizers import decoders
from transformers import AutoTokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def load_chat_template(spec: str) -> str:
    """--chat-template: a file's path, or the Jinja template itself (vLLM's rule: a path that
    exists is read, anything else is the template)."""
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            return f.read()
    if "{" not in spec:  # neither a file nor a template: most likely a mistyped path
        raise ValueError(f"chat template {spec!r}: no such file, and not a Jinja template")
    return spec


class Tokenization:
    def __init__(self, model_dir: str, threads: int, chat_template: str = "") -> None:
        """model_dir: the tokenizer's directory (the model's, or --tokenizer's); chat_template:
        replaces the tokenizer's own (load_chat_template's result)."""
        self.hf = AutoTokenizer.from_pretrained(model_dir)
        if chat_template:
            self.hf.chat_template = chat_template
        self._fast = self.hf.backend_tokenizer
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
        self.eos_token_id: int | None = self.hf.eos_token_id
        self.special_ids = frozenset(self.hf.all_special_ids)
        self._byte_level = isinstance(self._fast.decoder, decoders.ByteLevel)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._encode, text, add_special_tokens)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._fast.encode(text, add_special_tokens=add_special_tokens).ids

    async def encode_chat(
        self,
        messages: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final: bool = False,
    ) -> tuple[str, list[int]]:
        """The rendered chat and its tokens. The template writes any BOS itself, so the
        tokenizer adds no special tokens again."""
        loop = asyncio.get_running_loop()
        render = functools.partial(
            self.render_chat, messages, add_generation_prompt, template_kwargs, tools, continue_final
        )
        text = await loop.run_in_executor(self._pool, render)
        return text, await self.encode(text, add_special_tokens=False)

    async def decode(self, ids: list[int]) -> str:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._fast.decode, ids, False)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        continue_final: bool = False,
    ) -> str:
        """The model's chat template applied to OpenAI-style messages; template_kwargs: extra
        variables the template reads (vLLM's chat_template_kwargs, e.g. enable_thinking);
        tools: OpenAI's tool definitions, for a template that renders them; continue_final: the
        text ends where the last message's content does, left open for the model to continue
        (vLLM's continue_final_message; not with add_generation_prompt)."""
        if not getattr(self.hf, "chat_template", None):
            raise ValueError(
                "the model has no chat template (tokenizer_config.json chat_template); give one with --chat-template"
            )
        extra = template_kwargs or {}
        return self.hf.apply_chat_template(
            messages,
            tools=tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final,
            **extra,
        )

    def single_token(self, text: str) -> int | None:
        """The id of the one token text is (an added token such as </think>), else None."""
        ids = self._fast.encode(text, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else None

    def token_text(self, token_id: int) -> str:
        return self._fast.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, also when they are only part of a UTF-8 character."""
        text = self.token_text(token_id)
        if "\ufffd" not in text:
            return text.encode()
        piece = self._fast.id_to_token(token_id) or ""
        table = _byte_level_decoder()
        if self._byte_level and piece and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        if m := _BYTE_PIECE.fullmatch(piece):
            return bytes([int(m.group(1), 16)])
        return text.encode()

    def token_label(self, token_id: int) -> str:
        """A token as OpenAI's logprobs name it: its text, or "bytes:\\xe4\\xbd" when it is part of a character."""
        text = self.token_text(token_id)
        if "\ufffd" not in text:
            return text
        return "bytes:" + "".join(f"\\x{b:02x}" for b in self.token_bytes(token_id))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
