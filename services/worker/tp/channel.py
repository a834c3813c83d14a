"""Rank 0 -> the other ranks of a tensor-parallel group: each step's batch, by broadcast.

Rank 0 alone talks to Redis and schedules; before every forward it broadcasts the batch:
a fixed header of sizes, then every index tensor packed into one int64 tensor. The input
ids go as they are on the device, so a step whose inputs are still being sampled on the
device needs no host sync on rank 0. The other ranks rebuild their request-to-token
tables from the batch (each new token's row, position and slot are all in it), so the
tables of all ranks stay identical without any other message. Only rank 0 samples; every
later input is broadcast from it, so all ranks agree on every token by construction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from services.worker.forward_batch import ForwardBatch

_HEADER = 8  # [kind, tokens, extend tokens, extend segments, decodes, samples, extend max, decode max]
_BATCH, _STOP = 1, 0


class StepChannel:
    def __init__(self, group: dist.ProcessGroup | None, device: torch.device) -> None:
        self.group = group
        # NCCL moves device tensors; gloo, host tensors
        self.comm_device = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        self.device = device

    # ---------------------------------------------------------------- rank 0

    def send(self, b: ForwardBatch) -> None:
        header = [_BATCH, b.num_tokens, b.num_extend_tokens, b.num_extends, b.num_decodes,
                  int(b.sample_index.shape[0]), b.extend_max_len, b.decode_max_len]  # fmt: skip
        self._broadcast(torch.tensor(header, dtype=torch.int64).to(self.comm_device))
        parts = [b.input_ids, b.positions, b.out_slots, b.extend_rows, b.extend_starts, b.extend_lens,
                 b.extend_prefix_lens, b.decode_rows, b.decode_seq_lens, b.sample_index]  # fmt: skip
        self._broadcast(torch.cat([p.to(torch.int64) for p in parts]).to(self.comm_device))

    def stop(self) -> None:
        """Tell the other ranks to leave their loops."""
        self._broadcast(torch.tensor([_STOP] + [0] * (_HEADER - 1), dtype=torch.int64).to(self.comm_device))

    # ---------------------------------------------------------------- the other ranks

    def receive(self, req_table: torch.Tensor) -> ForwardBatch | None:
        """The next batch (its tokens' slots written into req_table), or None when told to stop."""
        header = torch.empty(_HEADER, dtype=torch.int64, device=self.comm_device)
        self._broadcast(header)
        kind, t, e, be, bd, s, ext_max, dec_max = header.tolist()
        if kind == _STOP:
            return None
        packed = torch.empty(3 * t + 4 * be + 2 * bd + s, dtype=torch.int64, device=self.comm_device)
        self._broadcast(packed)
        packed = packed.to(self.device)
        sizes = [t, t, t, be, be, be, be, bd, bd, s]
        ids, pos, slots, rows, starts, lens, prefix, drows, dlens, sample = torch.split(packed, sizes)

        def i32(x: torch.Tensor) -> torch.Tensor:
            return x.to(torch.int32)

        batch = ForwardBatch(
            input_ids=ids,
            positions=pos,
            out_slots=i32(slots),
            req_table=req_table,
            num_extend_tokens=e,
            extend_rows=i32(rows),
            extend_starts=i32(starts),
            extend_lens=i32(lens),
            extend_prefix_lens=i32(prefix),
            extend_max_len=ext_max,
            extend_lens_host=lens.tolist(),
            extend_prefix_lens_host=prefix.tolist(),
            decode_rows=i32(drows),
            decode_seq_lens=i32(dlens),
            decode_max_len=dec_max,
            sample_index=sample,
        )
        token_rows = torch.cat([torch.repeat_interleave(rows, lens), drows])  # [T], each token's table row
        req_table[token_rows, pos] = batch.out_slots
        return batch

    def _broadcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, src=0, group=self.group)
