"""A radix tree of token-id sequences: the prompt cache's index (SGLang's RadixAttention shape).

Each edge holds a run of token ids and, beside it, a value of the same length: on the worker
the KV slots of those tokens (a device tensor), in the router nothing (its index only needs to
know which sequences a group has seen). The page size is one token, so any prefix is reusable.

- ``match(tokens)`` finds the longest cached prefix, splitting an edge where the match ends so
  that the returned node covers exactly that prefix.
- ``insert(tokens, value)`` adds what is not there yet; it returns how much was there already,
  so the caller can give back its own copy of that part.
- ``lock(node)`` / ``unlock(node)`` count the requests using a path; a locked node and its
  ancestors are never evicted. An unlocked node's whole subtree is unlocked (locks go up to
  the root), so every unlocked token can be freed by evicting leaves, oldest first.
- ``evict(n)`` removes least-recently-used unlocked leaves until n tokens are freed, handing
  each one's value to ``on_evict``.

Edges keep their token ids as ``key_of`` makes them from a slice of the query: a list by
default, or a compact array (the router's index, which keeps ids and nothing else: 8 bytes a
token where a list of Python ints takes about 40). Queries must then be of the same type, since a
slice of a list never equals a slice of an array.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


class Node:
    __slots__ = ("children", "key", "last_access", "lock_ref", "parent", "value")

    def __init__(self, parent: Node | None, key: Sequence[int], value: Any, now: int) -> None:
        self.parent = parent
        self.key = key  # the token ids of the edge into this node
        self.value = value  # sliceable like key (or None)
        self.children: dict[int, Node] = {}  # first token of the child's key -> child
        self.lock_ref = 0
        self.last_access = now

    @property
    def evictable(self) -> bool:
        return self.parent is not None and not self.children and self.lock_ref == 0


@dataclass
class Match:
    length: int  # tokens of the query found in the tree
    node: Node  # the node ending exactly there (the root when length is 0)
    values: list[Any]  # the values along the path, root first (their lengths sum to length)
    unlocked: int  # of the matched tokens, how many no request holds (locking the node pins them)


def common_length(key: Sequence[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of key and tokens[start:]; slice compares run in C."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == tokens[start : start + n]:
        return n
    lo, hi = 0, n  # key[:lo] matches, key[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[:mid] == tokens[start : start + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _slice(value: Any, a: int, b: int | None = None) -> Any:
    return None if value is None else value[a:b]


class PrefixTree:
    def __init__(
        self,
        on_evict: Callable[[Any], None] | None = None,
        key_of: Callable[[Sequence[int]], Sequence[int]] = list,
    ) -> None:
        self._clock = itertools.count(1)
        self.key_of = key_of
        self.root = Node(None, key_of([]), None, 0)
        self.root.lock_ref = 1  # never evicted
        self.on_evict = on_evict
        self.evictable_size = 0  # tokens in unlocked nodes
        self.locked_size = 0  # tokens in locked nodes (the root's empty key aside)
        self.num_nodes = 0
        self._heap: list[tuple[int, int, Node]] = []  # (last_access, tie, node): eviction candidates
        self._tie = itertools.count()

    @property
    def size(self) -> int:
        return self.evictable_size + self.locked_size

    # ---------------------------------------------------------------- lookups

    def match(self, tokens: Sequence[int]) -> Match:
        now = next(self._clock)
        node, i, values, unlocked = self.root, 0, [], 0
        node.last_access = now
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = common_length(child.key, tokens, i)
            if k < len(child.key):
                child = self._split(child, k)
            child.last_access = now
            values.append(child.value)
            if child.lock_ref == 0:
                unlocked += k
            node, i = child, i + k
        if node.evictable:
            self._push(node)
        return Match(i, node, values, unlocked)

    def insert(self, tokens: Sequence[int], value: Any = None) -> int:
        """Cache tokens (value: one entry per token, or None); -> how many of them were cached
        already (their entries in value stay the caller's)."""
        now = next(self._clock)
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = Node(node, self.key_of(tokens[i:]), _slice(value, i), now)
                node.children[tokens[i]] = leaf
                self.num_nodes += 1
                self.evictable_size += len(leaf.key)
                self._push(leaf)
                return i
            k = common_length(child.key, tokens, i)
            if k < len(child.key):
                child = self._split(child, k)
            child.last_access = now
            node, i = child, i + k
        if node.evictable:
            self._push(node)
        return i

    def _split(self, child: Node, k: int) -> Node:
        """Cut child's edge after k tokens; -> the new upper node (which has child below it)."""
        upper = Node(child.parent, child.key[:k], _slice(child.value, 0, k), child.last_access)
        upper.lock_ref = child.lock_ref
        assert child.parent is not None
        child.parent.children[child.key[0]] = upper
        child.key = child.key[k:]
        child.value = _slice(child.value, k)
        child.parent = upper
        upper.children[child.key[0]] = child
        self.num_nodes += 1
        return upper

    # ---------------------------------------------------------------- references

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.locked_size += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        first = node
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("prefix tree: unlocking a node no one holds")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.locked_size -= len(node.key)
            node = node.parent  # type: ignore[assignment]
        if first.evictable:
            self._push(first)

    # ---------------------------------------------------------------- eviction

    def evict(self, n: int) -> int:
        """Free at least n tokens (fewer if not that many are unlocked), oldest leaves first; -> freed."""
        freed = 0
        while freed < n and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if not node.evictable or node.last_access != stamp or node.parent is None:
                continue  # a stale entry: the node was used, locked, grew children, or is gone
            parent = node.parent
            del parent.children[node.key[0]]
            node.parent = None
            self.num_nodes -= 1
            self.evictable_size -= len(node.key)
            freed += len(node.key)
            if self.on_evict is not None and node.value is not None:
                self.on_evict(node.value)
            if parent.evictable:
                self._push(parent)
        return freed

    def reset(self) -> None:
        """Forget everything (the caller frees what the values stand for)."""
        self.root.children.clear()
        self.evictable_size = self.locked_size = self.num_nodes = 0
        self._heap.clear()

    def _push(self, node: Node) -> None:
        if len(self._heap) > 4 * self.num_nodes + 64:  # mostly stale entries: rebuild
            live = {id(x): x for _, _, x in self._heap if x.evictable}
            self._heap = [(x.last_access, next(self._tie), x) for x in live.values()]
            heapq.heapify(self._heap)
        heapq.heappush(self._heap, (node.last_access, next(self._tie), node))
