"""Incremental detokenization: token ids in, text deltas out, equal in sum to a full decode.

Each push decodes only a short window: the tokens since the last emitted boundary,
with the previous chunk as left context (so a tokenizer that drops a word's leading
space at the start of a decode keeps it here). Text ending in U+FFFD is held back,
since the next token may complete a multi-byte character split across tokens; flush()
releases whatever is left when the request ends.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...


class IncrementalDecoder:
    __slots__ = ("_decoder", "_ids", "_prefix", "_read", "_skip")

    def __init__(self, decoder: Decoder, skip_special_tokens: bool = True) -> None:
        self._decoder = decoder
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the window: left context
        self._read = 0  # end of the text already emitted

    @property
    def num_tokens(self) -> int:
        return len(self._ids)

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the text that is now certain."""
        self._ids.extend(ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The request ended: return the remaining text, incomplete characters included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        # hold back: an incomplete character at the end, nothing new yet, or a decode that
        # rewrote the left context (it settles once more tokens arrive)
        if not final and (after.endswith(REPLACEMENT) or len(after) <= len(before) or not after.startswith(before)):
            return ""
        delta = after[len(before) :]
        self._prefix = self._read
        self._read = len(self._ids)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip) if ids else ""
