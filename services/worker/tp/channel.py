"""Rank 0 -> the other ranks of a tensor-parallel group: each step's batch.

Rank 0 alone talks to Redis and schedules; before every forward it sends the batch in two
parts, so that no rank's host ever waits for a device:
- the index lists its host built (sizes, positions, rows, lengths, sampled positions) go
  through a pipe to each other rank's host, which can then queue its own step at once,
  while its device still runs the step before;
- the input ids and KV slots, which rank 0 makes on its device (a decode input is the token
  the step before sampled), go by a broadcast queued on the devices' streams.
The other ranks rebuild their request-to-token tables from the batch (each new token's row,
position and slot are all in it, and so are the rows' prefixes the prompt cache wrote since
the last batch), so the tables of all ranks stay identical without any other message. Only
rank 0 samples; every later input is broadcast from it, so all ranks agree on every token
by construction. A pipe that closes (rank 0 died) ends a rank's loop.
"""

from __future__ import annotations

import contextlib
from array import array
from itertools import accumulate, pairwise
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from services.worker.forward_batch import ForwardBatch, HostIndex
from services.worker.host_copy import to_device
from services.worker.memory.req_table import ReqTable

# [kind, tokens, extend tokens, extend segments, decodes, samples, extend max, decode max,
#  rows whose prefix the prompt cache wrote, slots of those prefixes]
_HEADER = 10
_BATCH, _STOP = 1, 0


class StepChannel:
    def __init__(self, group: dist.ProcessGroup | None, device: torch.device, pipes: list[Connection]) -> None:
        """pipes: on rank 0, the writing end to each other rank; on the others, their reading end."""
        self.group = group
        self.pipes = pipes
        # NCCL moves device tensors; gloo, host tensors
        self.comm_device = device if dist.get_backend(group) == "nccl" else torch.device("cpu")
        self.device = device
        self.table: ReqTable | None = None  # rank 0 with the prompt cache: its rows' prefix writes go along

    # ---------------------------------------------------------------- rank 0

    def send(self, b: ForwardBatch) -> None:
        if b.host is None:
            raise ValueError("StepChannel.send: the batch has no host index (build it with build_batch)")
        h = b.host
        copies = self.table.take_mirror() if self.table is not None else []
        copy_rows = [row for row, _ in copies]
        copy_lens = [int(slots.numel()) for _, slots in copies]
        header = [
            _BATCH,
            b.num_tokens,
            b.num_extend_tokens,
            b.num_extends,
            b.num_decodes,
            len(h.sample_index),
            b.extend_max_len,
            b.decode_max_len,
            len(copies),
            sum(copy_lens),
        ]
        lists = [
            h.positions,
            h.extend_rows,
            h.extend_starts,
            b.extend_lens_host,
            b.extend_prefix_lens_host,
            h.decode_rows,
            h.decode_seq_lens,
            h.sample_index,
            copy_rows,
            copy_lens,
        ]
        msg = array("q", header)
        for values in lists:
            msg.extend(values)
        data = msg.tobytes()
        for pipe in self.pipes:
            pipe.send_bytes(data)
        ids_and_slots = torch.cat([b.input_ids, b.out_slots.to(torch.int64), *(x.to(torch.int64) for _, x in copies)])
        dist.broadcast(ids_and_slots.to(self.comm_device), src=0, group=self.group)

    def stop(self) -> None:
        """Tell the other ranks to leave their loops."""
        data = array("q", [_STOP] + [0] * (_HEADER - 1)).tobytes()
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # that rank is gone already
                pipe.send_bytes(data)

    # ---------------------------------------------------------------- the other ranks

    def receive(self, req_table: torch.Tensor) -> ForwardBatch | None:
        """The next batch (its tokens' slots written into req_table), or None when told to stop
        or when rank 0 is gone."""
        try:
            data = self.pipes[0].recv_bytes()
        except (EOFError, OSError):
            return None
        msg = array("q")
        msg.frombytes(data)
        kind, t, e, be, bd, s, ext_max, dec_max, nc, nq = msg[:_HEADER]
        if kind == _STOP:
            return None
        sizes = [t, be, be, be, be, bd, bd, s, nc, nc]
        ends = list(accumulate(sizes, initial=_HEADER))
        pos, rows, starts, lens, prefix, drows, dlens, sample, crows, clens = (
            msg[a:z].tolist() for a, z in pairwise(ends)
        )
        ids_and_slots = torch.empty(2 * t + nq, dtype=torch.int64, device=self.comm_device)
        dist.broadcast(ids_and_slots, src=0, group=self.group)
        ids_and_slots = ids_and_slots.to(self.device, non_blocking=True)

        def i32(values: list[int]) -> torch.Tensor:
            return to_device(values, torch.int32, self.device)

        batch = ForwardBatch(
            input_ids=ids_and_slots[:t],
            positions=to_device(pos, torch.int64, self.device),
            out_slots=ids_and_slots[t : 2 * t].to(torch.int32),
            req_table=req_table,
            num_extend_tokens=e,
            extend_rows=i32(rows),
            extend_starts=i32(starts),
            extend_lens=i32(lens),
            extend_prefix_lens=i32(prefix),
            extend_max_len=ext_max,
            extend_lens_host=lens,
            extend_prefix_lens_host=prefix,
            decode_rows=i32(drows),
            decode_seq_lens=i32(dlens),
            decode_max_len=dec_max,
            sample_index=to_device(sample, torch.int64, self.device),
            host=HostIndex(pos, rows, starts, drows, dlens, sample),
        )
        copied = ids_and_slots[2 * t :].to(torch.int32)
        for row, (a, z) in zip(crows, pairwise(accumulate(clens, initial=0)), strict=True):
            req_table[row, : z - a] = copied[a:z]
        token_rows = [r for r, n in zip(rows, lens, strict=True) for _ in range(n)] + drows
        req_table[to_device(token_rows, torch.int64, self.device), batch.positions] = batch.out_slots
        return batch
