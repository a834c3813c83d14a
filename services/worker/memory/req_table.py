"""The request-to-token table: row r, position p -> the KV slot holding that token.

Each running request owns one row for its lifetime; attention kernels read a
request's K and V through its row, so a request's tokens need not be contiguous.
"""

from __future__ import annotations

import torch


class ReqTable:
    def __init__(self, max_rows: int, max_context: int, device: torch.device | str, dummy_slot: int) -> None:
        self.max_rows = max_rows
        self.max_context = max_context
        # [max_rows + 1, max_context]; the last row is scratch for padded batch rows
        self.table = torch.full((max_rows + 1, max_context), dummy_slot, dtype=torch.int32, device=device)
        self.dummy_row = max_rows
        self._free_rows = list(range(max_rows - 1, -1, -1))
        # rank 0 of a tensor-parallel group with the prompt cache: the rows' prefixes written from
        # the cache, which the other ranks cannot rebuild from a batch's new tokens (tp/channel.py)
        self.mirror: list[tuple[int, torch.Tensor]] | None = None

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def allocate_row(self) -> int:
        if not self._free_rows:
            raise MemoryError("request table: no free row")
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record that positions [start, start + len(slots)) of the row live in these slots."""
        self.table[row, start : start + slots.numel()] = slots

    def write_prefix(self, row: int, slots: torch.Tensor) -> None:
        """Positions [0, len(slots)) of the row live in these slots (the prompt cache's)."""
        self.write(row, 0, slots)
        if self.mirror is not None:
            self.mirror.append((row, slots))

    def take_mirror(self) -> list[tuple[int, torch.Tensor]]:
        out, self.mirror = self.mirror or [], [] if self.mirror is not None else None
        return out

    def slots(self, row: int, end: int) -> torch.Tensor:
        """Slots of positions [0, end) of a row: [end] int32."""
        return self.table[row, :end]
