"""Requests that would compute a prompt prefix another request is computing now.

The prompt cache takes a prompt's tokens in as soon as the step computing them is launched
(KVManager.cache_progress), so a request that starts one step later finds them there. Two
requests that share a prefix the cache does not hold yet, started in the same step (or the
second while the first is still part-way through its prefill), would both compute it. The
scheduler holds the second back instead: it starts in a later step and reuses the prefix
(SGLang's scheduler does the same with a request that shares a prefix with one already in its
batch). Nothing is held back for a prefix the cache holds already, so a system prompt every
request shares costs nothing here once it is cached.

Prompts are compared by blocks of BLOCK tokens, through a chain of hashes over each prompt's
leading blocks (block k's hash covers every token before its end): no token-by-token scan, and
the hashes are kept per request. Pure Python: the router's simulated worker uses it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

BLOCK = 64  # tokens per compared block: a shared prefix shorter than this is not worth a wait
MAX_HELD_BACK = 64  # requests held back in one step at most (the scheduler's scan of its queue stays short)


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """The chained hashes of the whole blocks of tokens, first block first."""
    out, h = [], 0
    for end in range(BLOCK, len(tokens) + 1, BLOCK):
        h = hash((h, *tokens[end - BLOCK : end]))
        out.append(h)
    return out


class Prefilling:
    """The leading blocks of the prompts being computed in this step or the ones before it."""

    def __init__(self) -> None:
        self._blocks: set[int] = set()

    @classmethod
    def of(cls, running: Iterable[Any], caching: bool) -> Prefilling:
        """The blocks of the running requests still part-way through their prompts (none without
        a prompt cache: nothing computed is reused then, so nothing is worth waiting for). Each
        request has ``decoding``, ``pending`` (prompt tokens not computed yet) and ``blocks``."""
        out = cls()
        if caching:
            for r in running:
                if not r.decoding and r.pending > 0:
                    out.add(r.blocks)
        return out

    def __bool__(self) -> bool:
        return bool(self._blocks)

    def add(self, hashes: list[int]) -> None:
        self._blocks.update(hashes)

    def shared(self, hashes: list[int]) -> int:
        """Tokens of the prompt whose block hashes these are that a prompt being computed starts with."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n * BLOCK

    def worth_waiting(self, hashes: list[int], cached: int) -> bool:
        """A request whose cached prefix is ``cached`` tokens long would compute at least a block
        that a request being computed computes too: better wait for it."""
        return self.shared(hashes) >= cached + BLOCK
