"""A reasoning model's thinking read apart from its answer, as the text streams
(--reasoning-parser): the thinking goes to message.reasoning_content, the answer on.

- ``deepseek_r1`` (DeepSeek-R1 and models whose template opens the thinking in the prompt):
  the output is thinking until ``</think>`` (a leading ``<think>`` dropped); an output that
  never closes it is all thinking.
- ``qwen3`` (Qwen3's thinking mode): thinking only when the output opens with ``<think>``,
  until ``</think>``; an output that does not open with it (enable_thinking false) is all
  answer.

Whitespace right after ``</think>`` is the template's, not the answer's: it is dropped.
"""

from __future__ import annotations

from services.tokenizer.openai.text_scan import tag_start
from shared.config import REASONING_PARSERS

START, END = "<think>", "</think>"


class ReasoningReader:
    """feed(text) -> (thinking, answer) pieces of this much more text."""

    def __init__(self, parser: str) -> None:
        if parser not in REASONING_PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; known: {', '.join(REASONING_PARSERS)}")
        self.opens_in_prompt = parser == "deepseek_r1"  # else thinking only if the output opens it
        self.mode = "start"  # start -> thinking -> answer_start -> answer
        self.pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        thinking = answer = ""
        if self.mode == "start":
            body = self.pending.lstrip()
            if START.startswith(body) and len(body) < len(START):
                return "", ""  # it may yet open with <think>
            if body.startswith(START):
                self.pending, self.mode = body[len(START) :], "thinking"
            elif self.opens_in_prompt:
                self.mode = "thinking"
            else:
                self.mode = "answer"
        if self.mode == "thinking":
            end = self.pending.find(END)
            if end < 0:
                cut = len(self.pending) - tag_start(self.pending, END)
                thinking, self.pending = self.pending[:cut], self.pending[cut:]
                return thinking, ""
            thinking, self.pending, self.mode = self.pending[:end], self.pending[end + len(END) :], "answer_start"
        if self.mode == "answer_start":
            self.pending = self.pending.lstrip()
            if not self.pending:
                return thinking, ""
            self.mode = "answer"
        answer, self.pending = self.pending, ""
        return thinking, answer

    def finish(self) -> tuple[str, str]:
        """What is held back, at the end of the text."""
        left, self.pending = self.pending, ""
        if self.mode == "thinking" or (self.mode == "start" and self.opens_in_prompt):
            return left, ""
        return "", "" if self.mode == "answer_start" else left

    @property
    def thinking(self) -> bool:
        """Whether the answer has not begun (a format waits for it)."""
        return self.mode in ("start", "thinking")
