"""LightLLM's admission estimate: the most KV tokens a set of requests can ever hold at once.

Sort the requests by remaining output, longest first. When the i-th of them finishes,
the i requests with at least as much left are still running and have each grown by its
remaining length, and every request after it has finished and freed its tokens: the
pool then holds  held_1 + ... + held_i + i * remaining_i  tokens. The peak is the
largest of these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Load:
    held: int  # tokens the request holds now (or will hold as soon as it starts)
    remaining: int  # most output tokens still to come, as estimated


def peak_tokens(loads: Iterable[Load]) -> int:
    peak = 0
    held = 0
    for i, load in enumerate(sorted(loads, key=lambda x: -x.remaining), start=1):
        held += load.held
        peak = max(peak, held + i * load.remaining)
    return peak


def estimated_remaining(max_new_tokens: int, output_tokens: int, full: bool, guess_len: int) -> int:
    """Output tokens still to come: all of max_new_tokens when ``full`` (ignore_eos, or a busy
    pool), else LightLLM's bounded guess (at least guess_len, or 1.1 times what it has produced)."""
    cap = max_new_tokens if full else min(max_new_tokens, max(int(1.1 * output_tokens), guess_len))
    return max(cap - output_tokens, 0)
