"""Tool calls read out of a model's text as it streams: content, then each call's name and
its arguments piece by piece, as OpenAI streams them.

One reader per way a call is written:

- ``hermes`` (Hermes, Qwen 2.5/3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  anywhere in the text, as many as the model writes; the text around them is content.
- ``llama3_json`` (Llama 3.1/3.2): the whole answer is ``{"name": ..., "parameters": {...}}``,
  several separated by ``;``, optionally after ``<|python_tag|>``; an answer that does not
  start with ``{`` is content.
- tool_choice "required": a JSON array of ``{"name", "parameters"}`` (the grammar writes it).
- a named function: the whole text is that function's arguments (the grammar writes them).

A call's arguments are the text the model wrote for them, so a stream's pieces add up to the
whole answer's. A call whose object cannot be read (no name, not JSON) is given back as
content, as the model wrote it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from services.tokenizer.openai.text_scan import ValueScan, tag_start
from shared.config import TOOL_CALL_PARSERS


@dataclass
class CallDelta:
    """A piece of tool call ``index``: its id and name with its first piece, then arguments."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


Event = str | CallDelta  # a str is content


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class NotACall(Exception):
    """What stands where a call was expected is not one: its text goes back as content, and
    the text after it is read on."""

    def __init__(self, raw: str, rest: str) -> None:
        super().__init__(raw)
        self.raw = raw
        self.rest = rest


_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class CallObject:
    """One call written as a JSON object, its name first: the name once known, then the
    arguments as they come. Objects in another key order are read when they close."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.head = ""  # the object's text until its name and arguments key are read
        self.outer = ValueScan()
        self.args: ValueScan | None = None
        self.emitted = False  # some of the arguments went out

    @property
    def done(self) -> bool:
        return self.outer.done

    def feed(self, text: str) -> tuple[list[Event], str]:
        """-> the events, and the text after the object (once it is done)."""
        n = self.outer.take(text)
        mine, rest = text[:n], text[n:]
        out: list[Event] = []
        if self.args is None:
            self.head += mine
            if self.head.strip() and not self.head.lstrip().startswith("{"):
                raise NotACall(self.head + rest, "")
            m = _HEADER.match(self.head)
            if m is None:
                if self.outer.done:
                    out.append(self._whole(rest))
                return out, rest
            out.append(CallDelta(self.index, "", new_call_id(), json.loads(f'"{m.group(1)}"')))
            self.args = ValueScan()
            mine, self.head = self.head[m.end() :], ""
        if not self.args.done:
            piece = mine[: self.args.take(mine)]
            piece = piece if self.emitted else piece.lstrip()
            if piece:
                self.emitted = True
                out.append(CallDelta(self.index, piece))
        return out, rest

    def _whole(self, rest: str) -> CallDelta:
        try:
            obj = json.loads(self.head)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise NotACall(self.head, rest)
        args = obj.get("arguments", obj.get("parameters", {}))
        return CallDelta(self.index, json.dumps(args, ensure_ascii=False), new_call_id(), obj["name"])

    def leftover(self) -> str:
        """At the end of the text: what of an unfinished object is not out yet (no name read)."""
        return self.head if self.args is None else ""


class HermesReader:
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        self.pending = ""
        self.call: CallObject | None = None
        self.closing = False  # a call's object is done: its </tool_call> comes next
        self.fresh = False  # a call has closed and no content has come since
        self.count = 0

    def feed(self, text: str) -> list[Event]:
        self.pending += text
        out: list[Event] = []
        while self.pending:
            if self.call is not None:
                try:
                    events, self.pending = self.call.feed(self.pending)
                except NotACall as e:
                    events, self.pending = [self.OPEN + e.raw], e.rest
                    self.call = None
                    self.count -= 1
                out += events
                if self.call is not None and self.call.done:
                    self.call, self.closing = None, True
                continue
            if self.closing:
                body = self.pending.lstrip()
                if self.CLOSE.startswith(body) and len(body) < len(self.CLOSE):
                    break  # not all of it yet
                if body.startswith(self.CLOSE):
                    self.pending = body[len(self.CLOSE) :]
                self.closing, self.fresh = False, True
                continue
            start = self.pending.find(self.OPEN)
            if start < 0:
                cut = len(self.pending) - tag_start(self.pending, self.OPEN)
                out += self._text(self.pending[:cut])
                self.pending = self.pending[cut:]
                break
            out += self._text(self.pending[:start])
            self.pending = self.pending[start + len(self.OPEN) :]
            self.call = CallObject(self.count)
            self.count += 1
        return out

    def finish(self) -> list[Event]:
        if self.call is not None:
            left = self.call.leftover()
            return [self.OPEN + left] if left else []
        return [] if self.closing else self._text(self.pending)

    def _text(self, piece: str) -> list[Event]:
        """Content; after a call, the whitespace that separates it from what follows is not."""
        if self.fresh:
            piece = piece.lstrip()
            self.fresh = not piece
        return [piece] if piece else []


class SequenceReader:
    """Calls one after another, between an opening and a closing text: llama3_json's answer
    (``{...}; {...}``, after an optional <|python_tag|>) and the "required" array
    (``[{...}, {...}]``). An answer that does not open so is content (llama3_json)."""

    def __init__(self, opens: tuple[str, ...], separator: str, close: str = "") -> None:
        self.opens = opens
        self.separator = separator
        self.close = close
        self.pending = ""
        self.mode = "start"  # start -> calls (between calls) | call | text
        self.call: CallObject | None = None
        self.count = 0

    def feed(self, text: str) -> list[Event]:
        self.pending += text
        out: list[Event] = []
        while self.pending:
            if self.mode == "text":
                out.append(self.pending)
                self.pending = ""
            elif self.mode == "call":
                assert self.call is not None
                try:
                    events, self.pending = self.call.feed(self.pending)
                except NotACall as e:
                    events, self.pending, self.mode = [e.raw], e.rest, "text"
                out += events
                if self.call.done and self.mode == "call":
                    self.mode = "calls"
            elif not self._between():
                break
        return out

    def _between(self) -> bool:
        """Read what comes before a call; False when more text is needed to know what it is."""
        body = self.pending.lstrip()
        if not body:
            return False
        if self.mode == "start":
            opener = next((o for o in self.opens if body.startswith(o)), None)
            if opener is None:
                if any(o.startswith(body) for o in self.opens):
                    return False
                self.mode = "text"
            else:
                self.mode = "calls"
                body = body if opener == "{" else body[len(opener) :]
        elif body.startswith("{"):
            self.call = CallObject(self.count)
            self.count += 1
            self.mode = "call"
        elif self.separator and body.startswith(self.separator):
            body = body[len(self.separator) :]
        elif self.close and body.startswith(self.close):
            body, self.mode = body[len(self.close) :], "text"
        else:
            self.mode = "text"
        self.pending = body
        return True

    def finish(self) -> list[Event]:
        if self.mode == "call" and self.call is not None:
            left = self.call.leftover()
            return [left] if left else []
        if self.mode == "start":
            return [self.pending] if self.pending else []
        return []


class NamedReader:
    """The whole text is the arguments of the one function named by tool_choice."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if not self.started:
            self.started = True
            out.append(CallDelta(0, "", new_call_id(), self.name))
        if text:
            out.append(CallDelta(0, text))
        return out

    def finish(self) -> list[Event]:
        return [] if self.started else self.feed("")


ToolReader = HermesReader | SequenceReader | NamedReader


def parser_reader(parser: str) -> ToolReader:
    """The reader of --tool-call-parser's format."""
    if parser == "hermes":
        return HermesReader()
    if parser == "llama3_json":
        return SequenceReader(("<|python_tag|>", "{"), ";")
    raise ValueError(f"unknown tool call parser {parser!r}; known: {', '.join(TOOL_CALL_PARSERS)}")


def required_reader() -> ToolReader:
    return SequenceReader(("[",), ",", "]")
