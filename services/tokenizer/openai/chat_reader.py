"""One chat choice's text, as it streams, into the parts of OpenAI's message: the thinking
(reasoning_content, reasoning.py), the content and the tool calls (tool_calls.py).

A whole answer is its stream merged (``message``), so the two always agree.
"""

from __future__ import annotations

from typing import Any

from services.tokenizer.openai.reasoning import ReasoningReader
from services.tokenizer.openai.tool_calls import CallDelta, Event, ToolReader


class ChatReader:
    def __init__(self, reasoning: ReasoningReader | None, tools: ToolReader | None, parallel: bool = True) -> None:
        """parallel false (parallel_tool_calls): calls after the first are dropped."""
        self.reasoning = reasoning
        self.tools = tools
        self.parallel = parallel
        self.called = False  # a tool call has begun

    def feed(self, text: str) -> list[dict[str, Any]]:
        """-> chat deltas for this much more text (none while a tag may be starting)."""
        if self.reasoning is None:
            return self._answer(text, final=False)
        thinking, answer = self.reasoning.feed(text)
        return _thinking(thinking) + self._answer(answer, final=False)

    def finish(self) -> list[dict[str, Any]]:
        """The deltas held back until the end of the text."""
        out: list[dict[str, Any]] = []
        answer = ""
        if self.reasoning is not None:
            thinking, answer = self.reasoning.finish()
            out = _thinking(thinking)
        return out + self._answer(answer, final=True)

    def _answer(self, text: str, final: bool) -> list[dict[str, Any]]:
        if self.tools is None:
            return [{"content": text}] if text else []
        events = self.tools.feed(text) if text else []
        if final:
            events += self.tools.finish()
        return self._deltas(events)

    def _deltas(self, events: list[Event]) -> list[dict[str, Any]]:
        """Events -> deltas, consecutive pieces of one part joined."""
        out: list[dict[str, Any]] = []
        for e in events:
            if isinstance(e, str):
                if out and "content" in out[-1]:
                    out[-1]["content"] += e
                elif e:
                    out.append({"content": e})
                continue
            if e.index > 0 and not self.parallel:
                continue
            self.called = True
            last = out[-1]["tool_calls"][0] if out and "tool_calls" in out[-1] else None
            if last is not None and last["index"] == e.index and e.id is None:
                last["function"]["arguments"] += e.arguments
            else:
                out.append({"tool_calls": [_call(e)]})
        return out


def _thinking(text: str) -> list[dict[str, Any]]:
    return [{"reasoning_content": text}] if text else []


def _call(e: CallDelta) -> dict[str, Any]:
    if e.id is None:
        return {"index": e.index, "function": {"arguments": e.arguments}}
    return {"index": e.index, "id": e.id, "type": "function", "function": {"name": e.name, "arguments": e.arguments}}


def message(deltas: list[dict[str, Any]], with_reasoning: bool) -> dict[str, Any]:
    """A whole answer's message from all its deltas."""
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict[str, Any]] = {}
    for d in deltas:
        for c in d.get("tool_calls", []):
            if "id" in c:
                calls[c["index"]] = {"id": c["id"], "type": "function", "function": dict(c["function"])}
            else:
                calls[c["index"]]["function"]["arguments"] += c["function"]["arguments"]
    msg: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if with_reasoning:
        msg["reasoning_content"] = "".join(d.get("reasoning_content", "") for d in deltas) or None
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg
