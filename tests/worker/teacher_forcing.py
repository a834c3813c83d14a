"""Logits of every position of known sequences through the engine's own batches.

Prefill logits come from one extend step over the whole sequence; decode logits from
feeding the sequence one token per step after a prefill of its start, several
sequences per step (so decode batches run the CUDA graph of their bucket).
"""

from __future__ import annotations

import torch

from services.worker.batch_builder import build_batch
from services.worker.engine import Engine
from services.worker.request import Req
from services.worker.scheduler import StepPlan
from tests.worker.engine_driver import request


def prefill_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """[L, V] float32: the logits after each position of ids, from one prefill step."""
    req = Req(request("tf", ids, max_new_tokens=1), 0)
    plan = StepPlan(extends=[(req, len(ids))], extend_slots=[engine.kv.allocate(req, len(ids))], new_rows=[req])
    batch = build_batch(plan, engine.kv.table.table, engine.device)
    batch.sample_index = torch.arange(len(ids), device=engine.device)
    assert batch.host is not None
    batch.host.sample_index = list(range(len(ids)))  # what the other ranks of a TP group are sent
    logits = engine.runner.forward(batch).to(torch.float32, copy=True)
    engine.kv.release(req)
    return logits


def decode_logits(engine: Engine, seqs: list[list[int]], start: int) -> list[torch.Tensor]:
    """For each sequence, [L - start, V]: the logits after positions start..L-1, one decode step each."""
    reqs = []
    for k, ids in enumerate(seqs):
        req = Req(request(f"tf{k}", ids[:start], max_new_tokens=1), k)
        plan = StepPlan(extends=[(req, start)], extend_slots=[engine.kv.allocate(req, start)], new_rows=[req])
        engine.runner.forward(build_batch(plan, engine.kv.table.table, engine.device))
        req.kv_len = start
        reqs.append(req)
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    length = min(len(s) for s in seqs)
    for t in range(start, length):
        for req, ids in zip(reqs, seqs, strict=True):
            req.tokens = list(ids[: t + 1])
        slots = torch.cat([engine.kv.allocate(r, 1) for r in reqs])
        plan = StepPlan(decodes=list(reqs), decode_slots=slots)
        logits = engine.runner.forward(build_batch(plan, engine.kv.table.table, engine.device))
        for k in range(len(reqs)):
            out[k].append(logits[k].to(torch.float32, copy=True))
        for req in reqs:
            req.kv_len += 1
    for req in reqs:
        engine.kv.release(req)
    return [torch.stack(rows) for rows in out]
