"""The prompt cache: a radix tree of token ids over the KV pool (shared/prefix_tree.py), whose
values are the KV slots of those tokens, so a request whose prompt starts like an earlier one
takes that prefix's slots instead of recomputing it.

Slot ownership: a slot is free (the allocator's), a request's own, or the tree's. A request that
starts takes the longest cached prefix of its tokens (``reuse``): positions [0, cached_len) of
its row are the tree's slots, pinned by locking the node that ends there. As its prefill steps
are launched, what it has computed goes into the tree (``keep``), so requests that start in the
next steps share it; when it ends or is paused, everything it has computed does. Where another
request put the same tokens first, the request's own copies go back to the allocator and its
row is pointed at the tree's.

Every slot handed over is written (or being written) by a step already launched: the device
runs steps in order, so a later step that reads it through a row sees its K and V.
Unlocked tokens are as good as free: ``make_room`` evicts least-recently-used leaves when the
allocator runs short, before the scheduler would pause anyone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.memory.req_table import ReqTable
from services.worker.memory.token_allocator import TokenAllocator
from services.worker.request import Req
from shared.prefix_tree import Match, PrefixTree


@dataclass
class CacheStats:
    queries: int = 0  # tokens looked up when requests started (vLLM's prefix_cache_queries)
    hits: int = 0  # of which found in the cache (prefix_cache_hits)
    evicted: int = 0  # tokens evicted to make room


class PromptCache:
    def __init__(self, allocator: TokenAllocator, table: ReqTable) -> None:
        self.allocator = allocator
        self.table = table
        self._evicted: list[torch.Tensor] = []  # values of the nodes an eviction removed
        self.tree = PrefixTree(on_evict=self._evicted.append)
        self.stats = CacheStats()

    @property
    def evictable(self) -> int:
        return self.tree.evictable_size

    @property
    def locked(self) -> int:
        return self.tree.locked_size

    # ---------------------------------------------------------------- a request starts

    def lookup(self, req: Req) -> Match:
        """The longest cached prefix of the request's tokens, short of the last one (whose
        logits the request needs computed)."""
        return self.tree.match(req.tokens[: len(req.tokens) - 1])

    def reuse(self, req: Req, hit: Match) -> None:
        """Point the start of the request's row (which it holds, empty) at the prefix's slots."""
        assert req.row is not None and req.alloc_len == 0
        if hit.length:
            self.table.write_prefix(req.row, _joined(hit.values))
        self.tree.lock(hit.node)
        req.cache_node = hit.node
        req.cached_len = req.kv_len = req.alloc_len = hit.length
        if req.output_len == 0 and not req.cached_prompt:
            req.cached_prompt = hit.length
        self.stats.queries += len(req.tokens)
        self.stats.hits += hit.length

    # ---------------------------------------------------------------- a request has computed more

    def keep(self, req: Req, upto: int) -> None:
        """Cache the request's first ``upto`` tokens (launched steps compute their K and V) and
        hold them: they become the request's cached prefix."""
        assert req.row is not None
        if upto <= req.cached_len:
            return
        old = req.cached_len
        present = self._insert(req, upto)
        hit = self.tree.match(req.tokens[:upto])
        if present > old:  # another request cached part of it first: use the tree's copies
            self.table.write_prefix(req.row, _joined(hit.values))
        self.tree.lock(hit.node)
        self._unlock(req)
        req.cache_node = hit.node
        req.cached_len = upto

    def release(self, req: Req, upto: int) -> None:
        """The request gives its KV up (it ended or is paused): its first ``upto`` tokens stay in
        the tree, unheld; its slots past them go back to the allocator."""
        assert req.row is not None
        upto = max(upto, req.cached_len)
        if upto > req.cached_len:
            self._insert(req, upto)
        if req.alloc_len > upto:
            self.allocator.free(self.table.slots(req.row, req.alloc_len)[upto:])
        self._unlock(req)
        req.cached_len = 0

    def _insert(self, req: Req, upto: int) -> int:
        """Put tokens [0, upto) into the tree with the row's slots; free the request's own copies
        of what was there already; -> how much was."""
        assert req.row is not None
        slots = self.table.slots(req.row, upto).clone()  # [upto]: the tree keeps views of this
        present = self.tree.insert(req.tokens[:upto], slots)
        if present > req.cached_len:
            self.allocator.free(slots[req.cached_len : present])
        return present

    def _unlock(self, req: Req) -> None:
        if req.cache_node is not None:
            self.tree.unlock(req.cache_node)
            req.cache_node = None

    # ---------------------------------------------------------------- room

    def make_room(self, n: int) -> None:
        """Evict until the allocator has n free slots (or nothing unheld is left)."""
        short = n - self.allocator.num_free
        if short <= 0:
            return
        self.tree.evict(short)
        if self._evicted:
            freed = _joined(self._evicted)
            self._evicted.clear()
            self.allocator.free(freed)
            self.stats.evicted += int(freed.numel())


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The slot tensors one after another (no copy when there is one)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)
