"""What one worker group's prompt cache probably holds: the prompts the router placed there.

No KV crosses Redis, so the router keeps its own estimate per group: a prefix tree
(shared/prefix_tree.py, without values) of the input ids it placed on the group, kept within
about the group's pool (a worker's tree never holds more), least recently placed leaves
dropped past it. It is approximate: the worker evicts under its own memory pressure, so a
prefix found here may be gone there, and its statuses say how much it caches, not what.
The index lives in its GroupState, so a group that dies or restarts, whose new instance
starts with an empty cache, comes back with an empty index.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.prefix_tree import PrefixTree, common_length


class PrefixIndex:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tree = PrefixTree()

    @property
    def size(self) -> int:
        """Tokens the index holds."""
        return self.tree.size

    def match(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the index holds. Read-only: asking every group
        changes neither the tree's shape nor what it keeps (only a placement does)."""
        node, i = self.tree.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = common_length(child.key, tokens, i)
            i += k
            if k < len(child.key):
                break
            node = child
        return i

    def insert(self, tokens: Sequence[int]) -> None:
        """A request placed on the group: its prompt is (or soon will be) in the group's cache."""
        self.tree.insert(tokens)
        self._trim()

    def resize(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._trim()

    def reset(self) -> None:
        self.tree.reset()

    def _trim(self) -> None:
        over = self.tree.size - self.max_tokens
        if over > 0:
            self.tree.evict(over)
