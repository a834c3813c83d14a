"""Text <-> tokens for the front end, off the event loop.

Encoding runs in a small thread pool (the Rust tokenizer releases the GIL), so a long
prompt never blocks other requests' streams.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from transformers import AutoTokenizer


class Tokenization:
    def __init__(self, model_dir: str, threads: int) -> None:
        self.hf = AutoTokenizer.from_pretrained(model_dir)
        self._fast = self.hf.backend_tokenizer
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
        self.eos_token_id: int | None = self.hf.eos_token_id
        self.special_ids = frozenset(self.hf.all_special_ids)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._encode, text, add_special_tokens)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._fast.encode(text, add_special_tokens=add_special_tokens).ids

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The model's chat template applied to OpenAI-style messages."""
        if not getattr(self.hf, "chat_template", None):
            raise ValueError("the model has no chat template (tokenizer_config.json chat_template)")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def token_text(self, token_id: int) -> str:
        return self._fast.decode([token_id], skip_special_tokens=False)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
