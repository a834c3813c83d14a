"""KV memory per request: the verbs the scheduler speaks (can_allocate, allocate, release)."""

from __future__ import annotations

import torch

from services.worker.memory.req_table import ReqTable
from services.worker.memory.token_allocator import TokenAllocator
from services.worker.request import Req


class KVManager:
    def __init__(self, allocator: TokenAllocator, table: ReqTable) -> None:
        self.allocator = allocator
        self.table = table

    @property
    def capacity(self) -> int:
        return self.allocator.capacity

    @property
    def free_tokens(self) -> int:
        return self.allocator.num_free

    def can_allocate(self, n: int, new_rows: int = 0) -> bool:
        return self.allocator.can_allocate(n) and self.table.num_free_rows >= new_rows

    def allocate(self, req: Req, n: int) -> torch.Tensor:
        """Slots for the request's next n positions (from alloc_len), recorded in its row."""
        if req.row is None:
            req.row = self.table.allocate_row()
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
        slots = self.allocator.allocate(len(reqs))
        for r in reqs:
            r.alloc_len += 1
        return slots

    def release(self, req: Req) -> None:
        """Give back every slot and the row the request holds."""
        if req.row is None:
            return
        if req.alloc_len:
            self.allocator.free(self.table.slots(req.row, req.alloc_len))
        self.table.free_row(req.row)
        req.row = None
        req.kv_len = 0
        req.alloc_len = 0
