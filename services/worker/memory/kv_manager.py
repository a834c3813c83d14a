"""KV memory per request: the verbs the scheduler speaks (lookup, can_allocate, start, allocate,
cache_progress, release), over the pool's allocator, the request table and, unless it is
switched off, the prompt cache (prompt_cache.py), whose unheld tokens count as free."""

from __future__ import annotations

import torch

from services.worker.memory.prompt_cache import PromptCache
from services.worker.memory.req_table import ReqTable
from services.worker.memory.token_allocator import TokenAllocator
from services.worker.request import Req
from shared.prefix_tree import Match


class KVManager:
    def __init__(self, allocator: TokenAllocator, table: ReqTable, cache: PromptCache | None = None) -> None:
        self.allocator = allocator
        self.table = table
        self.cache = cache

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    @property
    def free_tokens(self) -> int:
        return self.allocator.num_free

    @property
    def evictable_tokens(self) -> int:
        """Cached tokens no request holds: evicted on demand, so as good as free."""
        return self.cache.evictable if self.cache is not None else 0

    @property
    def cache_locked_tokens(self) -> int:
        """Cached tokens running requests hold, each counted once."""
        return self.cache.locked if self.cache is not None else 0

    @property
    def caching(self) -> bool:
        """The prompt cache is on."""
        return self.cache is not None

    @property
    def available_tokens(self) -> int:
        """Free tokens and cached ones no request holds: all of the pool when nothing runs."""
        return self.allocator.num_free + self.evictable_tokens

    def can_allocate(self, n: int, new_rows: int = 0, pinned: int = 0) -> bool:
        """pinned: cached tokens that starting a request would hold, so no longer evictable."""
        room = self.available_tokens - pinned
        return n <= room and self.table.num_free_rows >= new_rows

    def lookup(self, req: Req) -> Match | None:
        """The request's longest cached prefix (None with the cache off); nothing is held yet."""
        return self.cache.lookup(req) if self.cache is not None else None

    def start(self, req: Req, hit: Match | None) -> None:
        """Give a waiting request a row, its first positions the cached prefix's slots."""
        req.row = self.table.allocate_row()
        if self.cache is not None and hit is not None:
            self.cache.reuse(req, hit)

    def allocate(self, req: Req, n: int) -> torch.Tensor:
        """Slots for the request's next n positions (from alloc_len), recorded in its row (taken
        now if it has none)."""
        if req.row is None:
            req.row = self.table.allocate_row()
        self._make_room(n)
        slots = self.allocator.allocate(n)
        self.table.write(req.row, req.alloc_len, slots)
        req.alloc_len += n
        return slots

    def allocate_one_each(self, reqs: list[Req]) -> torch.Tensor:
        """One slot for the next position of each request (which all hold rows and are decoding:
        alloc_len == kv_len), in one allocation: a decode step. The table is not written here:
        the step's batch records slot i at (reqs[i].row, reqs[i].kv_len) as it is built
        (batch_builder), before anything can read or free it."""
        for r in reqs:
            if r.alloc_len != r.kv_len:
                raise RuntimeError(f"request {r.rid}: decoding with {r.alloc_len} slots for {r.kv_len} tokens")
        self._make_room(len(reqs))
        slots = self.allocator.allocate(len(reqs))
        for r in reqs:
            r.alloc_len += 1
        return slots

    def cache_progress(self, req: Req) -> None:
        """A step computing more of the request's prompt is launched: cache what it has so far,
        so requests starting from the next step on share it."""
        if self.cache is not None and req.row is not None:
            self.cache.keep(req, req.computed_len)

    def release(self, req: Req) -> None:
        """Give back the row and every slot the request holds; with the cache, what it computed
        stays cached (unheld) for later requests."""
        if req.row is None:
            return
        if self.cache is not None:
            self.cache.release(req, req.computed_len)
        elif req.alloc_len:
            self.allocator.free(self.table.slots(req.row, req.alloc_len))
        self.table.free_row(req.row)
        req.row = None
        req.kv_len = 0
        req.alloc_len = 0

    def clear_cache(self) -> None:
        """Evict every cached token no request holds."""
        if self.cache is not None:
            self.cache.make_room(self.capacity)

    def _make_room(self, n: int) -> None:
        if self.cache is not None:
            self.cache.make_room(n)
