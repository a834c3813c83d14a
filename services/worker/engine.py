"""The engine: one step is schedule, build the batch, run the model, sample, commit.

It knows nothing of Redis: the worker service feeds it admitted requests and aborts,
and publishes what each step returns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from services.worker.batch_builder import build_batch
from services.worker.kv_manager import KVManager
from services.worker.models.llama import LlamaModel
from services.worker.request import Req
from services.worker.sampler import Sampler
from services.worker.scheduler import Scheduler
from shared.messages import ERR_FAILED, FINISH_ABORT, FINISH_ERROR, GenerateReq, RunningReq, TokenItem

log = logging.getLogger(__name__)


@dataclass
class StepOutput:
    items: list[tuple[str, TokenItem]]  # (detokenizer shard, item)
    num_tokens: int  # tokens the model ran this step
    changed: bool  # a request ended (its KV is free) or produced its first token


class Engine:
    def __init__(
        self, model: LlamaModel, kv: KVManager, scheduler: Scheduler, sampler: Sampler, device: torch.device
    ) -> None:
        self.model = model
        self.kv = kv
        self.scheduler = scheduler
        self.sampler = sampler
        self.device = device
        self._admitted = 0
        self.steps = 0

    # ---------------------------------------------------------------- requests in

    def add(self, msg: GenerateReq) -> None:
        self._admitted += 1
        self.scheduler.add(Req(msg, self._admitted))

    def abort(self, rid: str, reason: str = FINISH_ABORT) -> bool:
        return self.scheduler.abort(rid, reason) is not None

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.scheduler.finished)

    # ---------------------------------------------------------------- one step

    def step(self) -> StepOutput:
        self.scheduler.expire(time.time())
        plan = self.scheduler.schedule()
        sampled: list[Req] = []
        if not plan.empty:
            batch = build_batch(plan, self.kv.table.table, self.device)
            logits = self.model.forward(batch)  # [S, V]
            sampled = plan.sampled()
            out = self.sampler.sample(logits, sampled)
            self.scheduler.commit(plan, out.tokens, out.logprobs, out.top_logprobs)
            self.steps += 1
        finished = self.scheduler.take_finished()
        items = [(r.detok, self._item(r, with_token=True)) for r in sampled]
        got_token = {id(r) for r in sampled}
        items += [(r.detok, self._item(r, with_token=False)) for r in finished if id(r) not in got_token]
        num_tokens = sum(n for _, n in plan.extends) + len(plan.decodes)
        first_tokens = any(r.output_len == 1 for r in sampled)
        return StepOutput(items, num_tokens, changed=bool(finished) or first_tokens)

    @staticmethod
    def _item(req: Req, with_token: bool) -> TokenItem:
        return TokenItem(
            rid=req.rid,
            token_ids=[req.tokens[-1]] if with_token else [],
            logprobs=req.step_logprobs if with_token else [],
            top_logprobs=req.step_top_logprobs if with_token else [],
            finish_reason=req.finish_reason,
            error=req.error,
            error_kind=req.error_kind,
            prompt_tokens=req.prompt_len,
            output_tokens=req.output_len,
        )

    # ---------------------------------------------------------------- state out

    def running_reqs(self) -> list[RunningReq]:
        waiting = {id(r) for r in self.scheduler.waiting}
        return [
            RunningReq(
                rid=r.rid,
                detok=r.detok,
                prompt_tokens=r.prompt_len,
                held_tokens=len(r.tokens),
                remaining_tokens=r.remaining,
                paused=id(r) in waiting and r.output_len > 0,
            )
            for r in self.scheduler.all_requests()
        ]

    def fail_all(self, why: str) -> list[tuple[str, TokenItem]]:
        """End every request with an explicit error (the worker is going away)."""
        for req in self.scheduler.all_requests():
            req.error = why
            req.error_kind = ERR_FAILED
            self.scheduler.abort(req.rid, FINISH_ERROR)
        return [(r.detok, self._item(r, with_token=False)) for r in self.scheduler.take_finished()]
