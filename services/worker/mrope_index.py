"""M-RoPE's positions (Qwen2-VL, Qwen2.5-VL): three position streams per token, t, h and w.

A text token's three positions are equal and one more than the token before's largest. An
image's tokens (its grid of t x h x w merged patches, row-major) all start from the position
after the text before them: t, h and w are that start plus the token's frame, row and column.
The text after the image starts at the image's start plus max(h, w) (its t is 1), so an image of
n tokens takes fewer than n positions, and a request's decode position is its KV length plus a
delta (the largest prompt position + 1 - the prompt's length, zero or negative).

Torch-free and per request: a request whose images carry grids (GenerateReq.images' ImageRef.grid,
which the front end gives in language-model tokens: the image processor's grid_thw with h and w
divided by the spatial merge size) gets its RopePositions when the worker takes it in
(request.py), and the batch builder reads each step's rows from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Grid = tuple[int, int, int]  # (t, h, w) of an image's tokens, after the 2x2 spatial merge


@dataclass(frozen=True)
class RopePositions:
    """One request's M-RoPE positions: those of its prompt, and the delta of every later token."""

    prompt: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # [3][prompt length]: t, h, w
    delta: int  # a token at index i >= prompt length has all three positions i + delta

    def rows(self, start: int, n: int) -> tuple[list[int], list[int], list[int]]:
        """The three streams' positions of tokens start..start + n - 1 (prompt or output)."""
        end = len(self.prompt[0])
        later = list(range(max(start, end) + self.delta, start + n + self.delta))
        return tuple(list(stream[start : start + n]) + later for stream in self.prompt)  # type: ignore[return-value]


def rope_index(length: int, images: Sequence[tuple[int, Grid]]) -> RopePositions:
    """A prompt's positions from its images in order, each (offset of its first token, grid): the
    image's t * h * w tokens lie at [offset, offset + t * h * w), the other tokens are text."""
    streams: tuple[list[int], list[int], list[int]] = ([], [], [])
    nxt = 0  # the position of the next text token
    at = 0  # the next token of the prompt
    for offset, (t, h, w) in images:
        if offset < at or offset + t * h * w > length:
            raise ValueError(f"an image of grid {(t, h, w)} at {offset} is not in order within {length} tokens")
        _text(streams, nxt, offset - at)
        nxt += offset - at
        for ft in range(t):
            for row in range(h):
                for col in range(w):
                    streams[0].append(nxt + ft)
                    streams[1].append(nxt + row)
                    streams[2].append(nxt + col)
        nxt += max(h, w)
        at = offset + t * h * w
    _text(streams, nxt, length - at)
    nxt += length - at
    return RopePositions(prompt=(tuple(streams[0]), tuple(streams[1]), tuple(streams[2])), delta=nxt - length)


def _text(streams: tuple[list[int], list[int], list[int]], start: int, n: int) -> None:
    """n text tokens from position start: their three positions equal."""
    for s in streams:
        s.extend(range(start, start + n))
