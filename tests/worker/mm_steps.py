"""Hand-made steps of requests whose prompts have images through an engine's runner: the image
tokens' embeddings given (ForwardBatch.embeds), M-RoPE positions from each Req's rope, every
position's logits kept. What the worker's scheduler and scatter will do, done by hand for tests."""

from __future__ import annotations

import torch

from services.worker.batch_builder import build_batch
from services.worker.engine import Engine
from services.worker.forward_batch import EmbedRows
from services.worker.request import Req
from services.worker.scheduler import StepPlan


class MMSteps:
    """Steps of hand-made plans through the engine's runner, keeping each position's logits."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.logits: dict[str, list[torch.Tensor]] = {}

    def step(self, extends: list[tuple[Req, int]], decodes: list[Req], embeds: dict[str, torch.Tensor]) -> None:
        """embeds: per request id, the image embeddings of all its image tokens, in order."""
        kv = self.engine.kv
        plan = StepPlan(
            extends=extends,
            extend_slots=[kv.allocate(r, n) for r, n in extends],
            new_rows=[r for r, _ in extends if r.kv_len == 0],
            decodes=decodes,
            decode_slots=torch.cat([kv.allocate(r, 1) for r in decodes]) if decodes else None,
        )
        batch = build_batch(plan, kv.table.table, self.engine.device)
        batch.sample_index = torch.arange(batch.num_tokens)
        batch.embeds = self._embed_rows(extends, embeds)
        logits = self.engine.runner.forward(batch)
        rows = [(r, n) for r, n in extends] + [(r, 1) for r in decodes]
        at = 0
        for r, n in rows:
            self.logits.setdefault(r.rid, []).append(logits[at : at + n].float())
            at += n
            r.kv_len += n

    def _embed_rows(self, extends: list[tuple[Req, int]], embeds: dict[str, torch.Tensor]) -> EmbedRows | None:
        rows, values, start = [], [], 0
        image_id = self.engine.runner.model.cfg.image_token_id
        for r, n in extends:
            image_at = [i for i, t in enumerate(r.tokens[: r.prompt_len]) if t == image_id]
            for k, i in enumerate(image_at):
                if r.kv_len <= i < r.kv_len + n:
                    rows.append(start + i - r.kv_len)
                    values.append(embeds[r.rid][k])
            start += n
        return EmbedRows(torch.tensor(rows), torch.stack(values)) if rows else None
