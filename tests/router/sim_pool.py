"""The simulated worker's KV pool, with an optional prompt cache (a prefix tree over the pool,
as services/worker/memory/prompt_cache.py keeps one).

The pool holds each request's own tokens (``exclusive``) and, with the cache on, the tree's
tokens: those running requests hold (locked) and those no request holds (evictable, freed
on demand, least recently used first). A request starting matches its tokens (all but the
last, which must be computed for the first output's logits) against the tree, locks that
path and reuses its KV states; after its prefill, and when it finishes, what it computed
goes into the tree. Each tree value is the list of rolling KV states of its tokens (see
sim_worker.py), so a reused prefix gives a request exactly the states a recomputation
would: the outputs checked against SimModel.reference check the cache too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.prefix_tree import PrefixTree

if TYPE_CHECKING:
    from tests.router.sim_worker import SimReq


class SimPool:
    def __init__(self, capacity: int, prompt_cache: bool) -> None:
        self.capacity = capacity
        self.exclusive = 0  # tokens requests hold outside the tree
        self.tree = PrefixTree() if prompt_cache else None
        self.peak_used = 0
        self.prompt_tokens = 0  # prompt tokens of requests started (their first start only)
        self.hit_tokens = 0  # of those, found in the tree
        self.evicted = 0  # tokens evicted from the tree to make room

    @property
    def used(self) -> int:
        return self.exclusive + (self.tree.size if self.tree else 0)

    @property
    def evictable(self) -> int:
        return self.tree.evictable_size if self.tree else 0

    @property
    def locked(self) -> int:
        return self.tree.locked_size if self.tree else 0

    @property
    def room(self) -> int:
        """Tokens that can be allocated now: free ones, and the tree's evictable ones."""
        return self.capacity - self.used + self.evictable

    def alloc(self, n: int) -> None:
        short = n - (self.capacity - self.used)
        if short > 0 and self.tree is not None:
            self.evicted += self.tree.evict(short)
        self.exclusive += n
        assert self.used <= self.capacity, f"KV pool overflow: {self.used} > {self.capacity}"
        self.peak_used = max(self.peak_used, self.used)

    def peek(self, req: SimReq) -> tuple[int, int]:
        """-> (tokens of req the tree holds, how many of those no request holds: starting req takes
        them out of the room)."""
        if self.tree is None:
            return 0, 0
        m = self.tree.match(req.tokens[:-1])
        return m.length, m.unlocked

    def start(self, req: SimReq) -> None:
        """req leaves the queue to run: it reuses and locks what the tree holds of it."""
        if not req.started:
            req.started = True
            self.prompt_tokens += req.prompt_len
        if self.tree is None:
            return
        m = self.tree.match(req.tokens[:-1])
        if not m.length:
            return
        self.tree.lock(m.node)
        req.node, req.cached = m.node, m.length
        req.kv = [state for value in m.values for state in value]
        if req.output_len == 0:
            self.hit_tokens += m.length

    def cache(self, req: SimReq) -> None:
        """What req computed goes into the tree; its own copies of what was there already are freed."""
        if self.tree is None or len(req.kv) == req.cached:
            return
        n = len(req.kv)
        self.tree.insert(req.tokens[:n], req.kv)
        self.exclusive -= n - req.cached
        m = self.tree.match(req.tokens[:n])
        assert m.length == n
        self.tree.lock(m.node)
        self._unlock(req)
        req.node, req.cached = m.node, n

    def release(self, req: SimReq) -> None:
        """req stops holding KV (finished, aborted or paused): its own tokens are freed, its tree
        path unlocked (it stays cached, evictable)."""
        self.exclusive -= len(req.kv) - req.cached
        self._unlock(req)
        req.kv, req.cached, req.node = [], 0, None

    def _unlock(self, req: SimReq) -> None:
        if req.node is not None:
            assert self.tree is not None
            self.tree.unlock(req.node)

    def check(self, reqs: list[SimReq]) -> None:
        assert self.exclusive == sum(len(r.kv) - r.cached for r in reqs), "pool accounting drifted"
        assert 0 <= self.used <= self.capacity
