"""Text that arrives a piece at a time: where a JSON value in it ends, and how much of its
end may be the start of a tag.

The tool-call readers (tool_calls.py) stream a call's arguments as the model writes them:
each character is the arguments' until the value closes, and only a scan that follows
strings, escapes and nesting knows when that is. They and the reasoning reader
(reasoning.py) hold back the end of the text that may be the start of a tag.
"""

from __future__ import annotations

_END_OF_PRIMITIVE = frozenset(",}] \t\r\n")


class ValueScan:
    """Feed the characters of one JSON value (leading whitespace allowed); ``take`` says how
    many of them belong to it, and ``done`` when it has ended."""

    def __init__(self) -> None:
        self.started = False
        self.done = False
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._primitive = False

    def take(self, text: str) -> int:
        """How many leading characters of text are the value's (all of them until it ends)."""
        for i, c in enumerate(text):
            if self.done:
                return i
            self._char(c)
            if self.done and self._primitive:  # a number or literal ends at the character after it
                return i
        return len(text)

    def _char(self, c: str) -> None:
        if not self.started:
            if c.isspace():
                return
            self.started = True
            if c in "{[":
                self._depth = 1
            elif c == '"':
                self._in_string = True
            else:
                self._primitive = True
            return
        if self._primitive:
            self.done = c in _END_OF_PRIMITIVE
        elif self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                self.done = self._depth == 0
        elif c == '"':
            self._in_string = True
        elif c in "{[":
            self._depth += 1
        elif c in "}]":
            self._depth -= 1
            self.done = self._depth == 0


def tag_start(text: str, tag: str) -> int:
    """The length of the longest end of text that is a start of tag (to hold back: it may become it)."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0
