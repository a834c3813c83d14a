"""StepPlan -> ForwardBatch: lay the step's tokens out packed and move them to the device."""

from __future__ import annotations

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.scheduler import StepPlan


def build_batch(plan: StepPlan, req_table: torch.Tensor, device: torch.device) -> ForwardBatch:
    ids: list[int] = []
    pos: list[int] = []
    ext_rows, ext_starts, ext_lens, ext_prefix = [], [], [], []
    sample_index: list[int] = []
    for req, n in plan.extends:
        start = len(ids)
        ids.extend(req.tokens[req.kv_len : req.kv_len + n])
        pos.extend(range(req.kv_len, req.kv_len + n))
        ext_rows.append(req.row)
        ext_starts.append(start)
        ext_lens.append(n)
        ext_prefix.append(req.kv_len)
        if req.kv_len + n == len(req.tokens):
            sample_index.append(start + n - 1)
    num_extend = len(ids)
    dec_rows, dec_lens = [], []
    for req in plan.decodes:
        sample_index.append(len(ids))
        ids.append(req.tokens[-1])
        pos.append(req.kv_len)
        dec_rows.append(req.row)
        dec_lens.append(req.kv_len + 1)
    slots = list(plan.extend_slots)
    if plan.decode_slots is not None:
        slots.append(plan.decode_slots)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)

    def i64(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

    return ForwardBatch(
        input_ids=i64(ids),
        positions=i64(pos),
        out_slots=torch.cat(slots) if slots else i32([]),
        req_table=req_table,
        num_extend_tokens=num_extend,
        extend_rows=i32(ext_rows),
        extend_starts=i32(ext_starts),
        extend_lens=i32(ext_lens),
        extend_prefix_lens=i32(ext_prefix),
        extend_max_len=max(ext_lens, default=0),
        extend_lens_host=ext_lens,
        extend_prefix_lens_host=ext_prefix,
        decode_rows=i32(dec_rows),
        decode_seq_lens=i32(dec_lens),
        decode_max_len=max(dec_lens, default=0),
        sample_index=i64(sample_index),
    )
