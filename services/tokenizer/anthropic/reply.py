"""Anthropic's answer from the chat machinery's: the content blocks (text, tool_use, and
thinking with --reasoning-parser) built from the chat reader's deltas (openai/chat_reader.py),
the stop reason, the usage and the message object.

The same deltas make a whole answer's content and a stream's content_block_* events, so the two
always agree; a tool_use block's input is the JSON its input_json_delta pieces add up to.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from services.tokenizer.openai.stop_strings import stop_string_hit
from services.tokenizer.tokenization import Tokenization
from shared.messages import FINISH_LENGTH, FINISH_STOP

Event = tuple[str, dict[str, Any]]  # (event name, its data less "type")

_KINDS = {"content": ("text", "text_delta"), "reasoning_content": ("thinking", "thinking_delta")}


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells them (the chat reader's are OpenAI's call_...)."""
    return "toolu_" + call_id.removeprefix("call_")


class Blocks:
    """The content blocks of one answer, as its deltas come."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.arguments: dict[int, str] = {}  # a tool_use block's index -> its input's JSON text so far
        self.open = False  # the last block may still grow
        self.called = False  # a tool_use block began

    def feed(self, deltas: list[dict[str, Any]]) -> list[Event]:
        out: list[Event] = []
        for d in deltas:
            out += self._call(d["tool_calls"][0]) if "tool_calls" in d else self._text(d)
        return out

    def _text(self, delta: dict[str, Any]) -> list[Event]:
        ((key, piece),) = delta.items()
        kind, delta_type = _KINDS[key]
        if not piece:
            return []
        out: list[Event] = []
        if not (self.open and self.blocks[-1]["type"] == kind):
            out = self._start({"type": kind, kind: ""} | ({"signature": ""} if kind == "thinking" else {}))
        self.blocks[-1][kind] += piece
        return [*out, self._delta({"type": delta_type, kind: piece})]

    def _call(self, call: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        if "id" in call:  # a call begins
            self.called = True
            block = {"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["function"]["name"], "input": {}}
            out = self._start(block)
            self.arguments[len(self.blocks) - 1] = ""
        piece = call["function"]["arguments"]
        if piece:
            self.arguments[len(self.blocks) - 1] += piece
            out.append(self._delta({"type": "input_json_delta", "partial_json": piece}))
        return out

    def _start(self, block: dict[str, Any]) -> list[Event]:
        out = self.close()
        self.blocks.append(block)
        self.open = True
        return [*out, ("content_block_start", {"index": len(self.blocks) - 1, "content_block": dict(block)})]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {"index": len(self.blocks) - 1, "delta": delta}

    def close(self) -> list[Event]:
        """The open block's end, if one is open."""
        if not self.open:
            return []
        self.open = False
        return [("content_block_stop", {"index": len(self.blocks) - 1})]

    def content(self) -> list[dict[str, Any]]:
        """The whole content; a tool_use block's input is its JSON read as an object ({} where the
        text is not one: an input cut short by max_tokens)."""
        out = [dict(b) for b in self.blocks]
        for i, text in self.arguments.items():
            try:
                value = json.loads(text) if text.strip() else {}
            except ValueError:
                value = {}
            out[i]["input"] = value if isinstance(value, dict) else {}
        return out


def stop_reason(finish: str, called: bool, stop_sequence: str) -> str:
    if finish == FINISH_LENGTH:
        return "max_tokens"
    if stop_sequence:
        return "stop_sequence"
    return "tool_use" if called else "end_turn"


def usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, int]:
    """Anthropic's count: input_tokens are the prompt's tokens not read from the prompt cache,
    cache_read_input_tokens those that were (their sum is the prompt, as count_tokens gives it);
    nothing is written to a cache on request, so cache_creation_input_tokens is 0."""
    return {
        "input_tokens": prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


class Shell:
    """What one answer's message holds beside its content: its id, model, prompt, stop strings."""

    def __init__(self, tok: Tokenization, model: str, prompt_tokens: int, stops: list[str]) -> None:
        self.id = "msg_" + secrets.token_hex(12)
        self.tok, self.model, self.prompt_tokens, self.stops = tok, model, prompt_tokens, stops

    def message(
        self, content: list[dict[str, Any]], reason: str | None, stop_sequence: str, use: dict[str, int]
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop_sequence or None,
            "usage": use,
        }

    async def stop_hit(self, finish: str, token_ids: list[int], text: str) -> str:
        """The stop sequence that ended the answer ("" when none did): the detokenizer cuts it off
        the text, so it is found again past the text in the output's tokens."""
        if finish != FINISH_STOP or not self.stops:
            return ""
        return await stop_string_hit(self.tok, token_ids, text, self.stops, True)
