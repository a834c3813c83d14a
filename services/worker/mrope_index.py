"""M-RoPE's positions (Qwen2-VL, Qwen2.5-VL): three position streams per token, t, h and w.

A text token's three positions are equal and one more than the token before's largest. An
image's tokens (its grid of t x h x w merged patches, row-major, each an image pad token in the
prompt) all start from the position after the text before them: t, h and w are that start plus
the token's frame, row and column. The text after the image starts at the image's start plus
max(h, w) (its t is 1), so an image of n tokens takes fewer than n positions, and a request's
decode position is its KV length plus a delta (the largest prompt position + 1 - the prompt's
length, zero or negative).

Torch-free and per request: the worker builds a request's RopePositions when the request arrives
with its images' grids (in merged-token units: the image processor's grid_thw with h and w divided
by the spatial merge size), and the batch builder reads each step's rows from it.
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


def rope_index(input_ids: Sequence[int], image_token_id: int, grids: Sequence[Grid]) -> RopePositions:
    """A prompt's positions, its images' grids in order. Each maximal run of image_token_id is one
    image (a vision_start token always separates two) and must have t * h * w tokens."""
    ids = list(input_ids)
    streams: tuple[list[int], list[int], list[int]] = ([], [], [])
    images = iter(grids)
    seen = 0
    nxt = 0  # the position of the next text token
    i = 0
    while i < len(ids):
        if ids[i] != image_token_id:
            for s in streams:
                s.append(nxt)
            nxt += 1
            i += 1
            continue
        try:
            t, h, w = next(images)
        except StopIteration:
            raise ValueError(f"more images in the prompt than the {len(grids)} grids given") from None
        run = t * h * w
        if ids[i : i + run] != [image_token_id] * run or (i + run < len(ids) and ids[i + run] == image_token_id):
            raise ValueError(f"image {seen}'s grid {(t, h, w)} does not match its image tokens in the prompt")
        seen += 1
        for ft in range(t):
            for row in range(h):
                for col in range(w):
                    streams[0].append(nxt + ft)
                    streams[1].append(nxt + row)
                    streams[2].append(nxt + col)
        nxt += max(h, w)
        i += run
    if next(images, None) is not None:
        raise ValueError(f"{len(grids)} grids for fewer images in the prompt")
    delta = nxt - len(ids)
    return RopePositions(prompt=(tuple(streams[0]), tuple(streams[1]), tuple(streams[2])), delta=delta)
