"""Free token slots of the KV pool: allocate(n) -> slots, free(slots).

The free list lives on the pool's device as a stack, so allocating and freeing are
device copies with no host synchronisation; only the count is kept on the host.
"""

from __future__ import annotations

import torch


class TokenAllocator:
    def __init__(self, capacity: int, device: torch.device | str) -> None:
        self.capacity = capacity
        self._stack = torch.arange(capacity, dtype=torch.int32, device=device)  # [capacity]
        self.num_free = capacity

    @property
    def num_used(self) -> int:
        return self.capacity - self.num_free

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> torch.Tensor:
        """n free slots as an int32 tensor [n] of its own (not a view of the free list)."""
        if n > self.num_free:
            raise MemoryError(f"KV pool: {n} slots asked, {self.num_free} free")
        self.num_free -= n
        return self._stack[self.num_free : self.num_free + n].clone()

    def free(self, slots: torch.Tensor) -> None:
        n = int(slots.numel())
        if self.num_free + n > self.capacity:
            raise RuntimeError(f"KV pool: freeing {n} slots would exceed capacity {self.capacity}")
        self._stack[self.num_free : self.num_free + n] = slots.to(torch.int32)
        self.num_free += n
