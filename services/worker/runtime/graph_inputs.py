"""A decode-only step's inputs in one buffer laid out as the decode graphs' own inputs.

The decode graphs read their six inputs (ids, positions, KV slots, table rows, lengths, rotary
positions) from
static tensors, which here are views of one byte buffer. A decode-only batch for the graphs
is built into a fresh buffer of the same layout: one host-to-device copy of the host's lists
and one kernel (kernels/pack_decode_inputs.py), which also takes the tokens still in flight from the
previous step's samples, writes the padding lanes, and records the new tokens' slots in the
request table. The graphs then load it with one device copy of the whole buffer. The batch owns
its buffer, so building another batch before it runs changes nothing of it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from services.worker.forward_batch import ForwardBatch, HostIndex
from services.worker.host_copy import to_device


class DecodeInputViews(NamedTuple):
    """The six inputs, [width] each, in the order kernels/pack_decode_inputs.py writes them."""

    input_ids: torch.Tensor  # int64
    positions: torch.Tensor  # int64
    out_slots: torch.Tensor  # int32
    rows: torch.Tensor  # int32
    seq_lens: torch.Tensor  # int32
    rotary_positions: torch.Tensor  # int64, where rotary turns the new token (M-RoPE: position + delta)


class DecodeInputs:
    def __init__(self, width: int, dummy_slot: int, dummy_row: int, device: torch.device) -> None:
        """width: the most requests a batch may hold (the largest decode graph)."""
        self.width = width
        self.dummy_slot = dummy_slot
        self.dummy_row = dummy_row
        self.device = device
        # imported here, as the other kernels: they compile for the device they first see
        from services.worker.kernels.pack_decode_inputs import OUTPUTS, decode_inputs

        self._fill = decode_inputs
        self._dtypes = tuple(OUTPUTS.values())
        self._offsets = []
        size = 0
        for dtype in self._dtypes:
            self._offsets.append(size)
            # 16-byte aligned, as a tensor of its own: the kernels the graphs capture are
            # specialised on that, and the same compiled kernels serve the eager steps
            size += -(-width * dtype.itemsize // 16) * 16
        self.nbytes = size
        self.static = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        static = self.views(self.static)
        static.out_slots.fill_(dummy_slot)
        static.rows.fill_(dummy_row)
        static.seq_lens.fill_(1)

    def views(self, buf: torch.Tensor) -> DecodeInputViews:
        """The six inputs of a buffer of this layout, [width] each."""
        return DecodeInputViews(
            *(buf[o : o + self.width * d.itemsize].view(d) for o, d in zip(self._offsets, self._dtypes, strict=True))
        )

    def fits(self, num_decodes: int) -> bool:
        return 0 < num_decodes <= self.width

    def build(
        self,
        tokens: list[int],
        positions: list[int],
        rows: list[int],
        slots: torch.Tensor,
        req_table: torch.Tensor,
        prev: torch.Tensor | None,
        rotary_offsets: list[int] | None = None,
    ) -> ForwardBatch:
        """A decode-only batch: per request its input token (-1 - j: row j of prev, the step
        before's sampled tokens, still on the device), its position (= tokens in its KV before
        this one), its table row and its rotary offset (M-RoPE's delta; None: all 0); slots [n]
        int32, where the new tokens' K and V go, recorded in req_table at (row, position) by the
        same kernel. The sampled positions (0..n-1) and the rows as int64 (``sample_rows``, for
        the sampler) come in the same copy."""
        n = len(tokens)
        lens = [p + 1 for p in positions]
        longest = max(lens)
        if longest > req_table.shape[1]:  # the kernel writes the table without bounds checks
            raise ValueError(f"decode inputs: position {longest - 1} is past the request table's {req_table.shape[1]}")
        offsets = rotary_offsets if rotary_offsets is not None else [0] * n
        pack = to_device([tokens, positions, rows, offsets, list(range(n))], torch.int64, self.device)
        buf = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        views = self.views(buf)
        self._fill(pack[:4], prev, slots, req_table, views, self.dummy_slot, self.dummy_row)
        host = HostIndex(positions, [], [], rows, lens, list(range(n)))
        return ForwardBatch.decodes(
            views.input_ids[:n],
            views.positions[:n],
            views.out_slots[:n],
            req_table,
            views.rows[:n],
            views.seq_lens[:n],
            longest,
            pack[4],
            host=host,
            staged=buf,
            sample_rows=pack[2],
            rotary_positions=views.rotary_positions[:n],
        )

    def load(self, batch: ForwardBatch) -> bool:
        """Copy a batch built here into the graphs' inputs; False when it was built otherwise."""
        if batch.staged is None or batch.staged.shape != self.static.shape:
            return False
        self.static.copy_(batch.staged)
        return True
