"""Stop strings, matched on text (not tokens) and cut exactly.

Text that could be the start of a stop string is held back until the next text shows
whether it is one, so a stop string is never sent to the client, not even in part.
"""

from __future__ import annotations


class StopMatcher:
    __slots__ = ("_held", "_stops")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """-> (text safe to send, whether a stop string ended the output)."""
        if not self._stops:
            return text, False
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._held = ""
            return buf[: min(hits)], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The output ended without a stop string: release what was held back."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest end of buf that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:k]):
                    best = k
                    break
        return best
