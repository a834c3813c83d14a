"""What one worker group's prompt cache probably holds: the prompts the router placed there.

No KV crosses Redis, so the router keeps its own estimate per group: a prefix tree
(shared/prefix_tree.py, without values) of the input ids it placed on the group, kept within
about the group's pool (a worker's tree never holds more), least recently placed leaves
dropped past it. It is approximate: the worker evicts under its own memory pressure, so a
prefix found here may be gone there, and its statuses say how much it caches, not what.
Token ids are kept in int64 arrays, queries converted likewise (8 bytes a token, not the
40 of a list of Python ints: two groups' indexes at 25,000 tokens each took 4 MB as lists).
The index lives in its GroupState, so a group that dies or restarts, whose new instance
starts with an empty cache, comes back with an empty index.

A placed request holds its prompt's path locked until it leaves the group, as it will hold
those tokens in the worker's tree: ``locked_size`` is the tokens of the prompts placed there,
each counted once however many requests share it, the started and the not yet started alike.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from shared.prefix_tree import Node, PrefixTree, common_length


@dataclass(frozen=True)
class IndexMatch:
    length: int  # leading tokens of the query the index holds
    locked: int  # of those, the ones placed requests hold (always the first ones: locks reach the root)


def ids(tokens: Sequence[int]) -> array:
    """Token ids as the index keeps and compares them."""
    return tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)


class PrefixIndex:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tree = PrefixTree(key_of=ids)

    @property
    def size(self) -> int:
        """Tokens the index holds."""
        return self.tree.size

    @property
    def locked_size(self) -> int:
        """Tokens of the prompts of the requests placed there, each counted once."""
        return self.tree.locked_size

    def match(self, tokens: Sequence[int]) -> IndexMatch:
        """How much of ``tokens`` the index holds. Read-only: asking every group changes neither
        the tree's shape nor what it keeps (only a placement does)."""
        tokens = ids(tokens)
        node, i, locked = self.tree.root, 0, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = common_length(child.key, tokens, i)
            i += k
            if child.lock_ref:
                locked += k
            if k < len(child.key):
                break
            node = child
        return IndexMatch(i, locked)

    def hold(self, tokens: Sequence[int]) -> Node:
        """A request placed on the group: its prompt is (or soon will be) in the group's cache,
        held by it until ``release``; -> the handle to release it by."""
        tokens = ids(tokens)
        self.tree.insert(tokens)
        node = self.tree.match(tokens).node
        self.tree.lock(node)
        self._trim()
        return node

    def release(self, node: Node) -> None:
        """The request left the group: its prompt stays cached there, no longer held."""
        self.tree.unlock(node)
        self._trim()

    def resize(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._trim()

    def reset(self) -> None:
        """Forget everything (only while no placed request holds a path)."""
        assert not self.tree.locked_size, "resetting an index that placed requests hold"
        self.tree.reset()

    def _trim(self) -> None:
        over = self.tree.size - self.max_tokens
        if over > 0:
            self.tree.evict(over)
