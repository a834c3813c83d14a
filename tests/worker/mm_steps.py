"""Requests whose prompts have images, made as the front end and the worker's intake make them
(each image's positions holding its pseudo-id, its rows and grid an ImageSpan, so the Req's
M-RoPE positions follow), and hand-made steps of them through an engine's runner keeping every
position's logits; decode-only steps may be built in the decode graphs' input layout."""

from __future__ import annotations

import torch

from services.worker.batch_builder import build_batch
from services.worker.engine import Engine
from services.worker.request import ImageSpan, Req
from services.worker.runtime.graph_inputs import DecodeInputs
from services.worker.scheduler import StepPlan
from shared.vision_config import image_pseudo_id
from tests.worker.engine_driver import request


def image_req(
    rid: str, ids: list[int], image_id: int, rows: torch.Tensor, grids: list[tuple[int, int, int]], **params
) -> Req:
    """ids with each image as a run of image_id (as Hugging Face's processor expands them); rows
    [image tokens, H]: every image's embeddings in order; grids: each image's (t, h, w) in tokens."""
    ids, spans, at, used = list(ids), [], 0, 0
    for k, (t, h, w) in enumerate(grids):
        n = t * h * w
        start = ids.index(image_id, at)
        assert ids[start : start + n] == [image_id] * n, f"image {k}: its grid does not fit its tokens"
        ids[start : start + n] = [image_pseudo_id(f"{k + 1:x}{rid.encode().hex()}".ljust(16, "0"))] * n
        spans.append(ImageSpan(start, rows[used : used + n], (t, h, w)))
        at, used = start + n, used + n
    return Req(request(rid, ids, **params), 0, spans)


class MMSteps:
    """Steps of hand-made plans through the engine's runner, keeping each position's logits."""

    def __init__(self, engine: Engine, staged: bool = False) -> None:
        """staged: decode-only steps are built as the decode graphs take them (graph_inputs.py)."""
        self.engine = engine
        self.logits: dict[str, list[torch.Tensor]] = {}
        cache = engine.runner.model.attn.cache
        layout = engine.runner.staging or DecodeInputs(8, cache.dummy_slot, engine.kv.table.dummy_row, engine.device)
        self.staging = layout if staged else None  # the decode graphs' own where the engine has them
        self.staged_steps = 0

    def step(self, extends: list[tuple[Req, int]], decodes: list[Req]) -> None:
        kv = self.engine.kv
        plan = StepPlan(
            extends=extends,
            extend_slots=[kv.allocate(r, n) for r, n in extends],
            new_rows=[r for r, _ in extends if r.kv_len == 0],
            decodes=decodes,
            decode_slots=torch.cat([kv.allocate(r, 1) for r in decodes]) if decodes else None,
        )
        batch = build_batch(plan, kv.table.table, self.engine.device, staging=self.staging)
        self.staged_steps += batch.staged is not None
        batch.sample_index = torch.arange(batch.num_tokens, device=self.engine.device)
        logits = self.engine.runner.forward(batch)
        rows = [(r, n) for r, n in extends] + [(r, 1) for r in decodes]
        at = 0
        for r, n in rows:
            # a copy: a replayed graph's logits are its output buffer, which the next replay overwrites
            self.logits.setdefault(r.rid, []).append(logits[at : at + n].to(torch.float32, copy=True))
            at += n
            r.kv_len += n
