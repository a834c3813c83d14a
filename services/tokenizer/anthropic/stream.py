"""One answer's server-sent events, in Anthropic's order: message_start (the message with no
content, its input usage), then per block content_block_start, content_block_delta pieces and
content_block_stop (a ping after the first block's start), then message_delta (the stop reason
and sequence, the output tokens) and message_stop. Each event has its ``event:`` line.

A generation that fails after the stream began ends it with an ``error`` event, Anthropic's
error body with the type the failure's status stands for: never a stream cut short in silence.
"""

from __future__ import annotations

from typing import Any

from services.tokenizer.anthropic.reply import Blocks, Event, Shell, stop_reason, usage
from services.tokenizer.errors import failed_event
from services.tokenizer.metrics import FrontMetrics
from services.tokenizer.openai.chat_reader import ChatReader
from services.tokenizer.streaming import sse
from shared.messages import FINISH_ERROR, TextItem


def event(name: str, **fields: Any) -> bytes:
    return sse({"type": name, **fields}, event=name)


class MessageStream:
    def __init__(self, shell: Shell, reader: ChatReader, metrics: FrontMetrics, route: str) -> None:
        self.shell, self.reader, self.metrics, self.route = shell, reader, metrics, route
        self.blocks = Blocks()
        self.pinged = False
        self.token_ids: list[int] = []
        self.text = ""  # the answer's text as the detokenizer sent it

    def start(self, cached: int) -> bytes:
        """message_start; cached: the prompt tokens the prompt cache held (known from the first item)."""
        use = usage(self.shell.prompt_tokens, 0, cached)
        return event("message_start", message=self.shell.message([], None, "", use))

    async def step(self, item: TextItem) -> tuple[list[bytes], bool]:
        """The events for one item, and whether the stream is over."""
        if item.finish_reason == FINISH_ERROR:
            return [failed_event(self.metrics, self.route, item)], True
        self.token_ids += item.token_ids
        self.text += item.text
        deltas = self.reader.feed(item.text) + (self.reader.finish() if item.finish_reason else [])
        out = self._sent(self.blocks.feed(deltas))
        if not item.finish_reason:
            return out, False
        out += self._sent(self.blocks.close())
        if not self.pinged:  # an answer with no content: the ping still comes, before the end
            out.append(event("ping"))
        hit = await self.shell.stop_hit(item.finish_reason, self.token_ids, self.text)
        reason = stop_reason(item.finish_reason, self.blocks.called, hit)
        delta = {"stop_reason": reason, "stop_sequence": hit or None}
        out.append(event("message_delta", delta=delta, usage={"output_tokens": item.output_tokens}))
        out.append(event("message_stop"))
        return out, True

    def _sent(self, events: list[Event]) -> list[bytes]:
        out = []
        for name, data in events:
            out.append(event(name, **data))
            if name == "content_block_start" and not self.pinged:
                out.append(event("ping"))
                self.pinged = True
        return out
