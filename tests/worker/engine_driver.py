"""Drive an Engine to completion without Redis, for tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.worker.engine import Engine
from shared.messages import GenerateReq, SamplingParams


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    logprobs: list[float] = field(default_factory=list)


def request(rid: str, ids: list[int], **params) -> GenerateReq:
    return GenerateReq(rid, "front", "detok", ids, SamplingParams(**params), 0.0, 0.0)


def run(engine: Engine, reqs: list[GenerateReq], max_steps: int = 10_000) -> dict[str, Outcome]:
    out = {r.rid: Outcome() for r in reqs}
    for r in reqs:
        engine.add(r)
    for _ in range(max_steps):
        if not engine.has_work():
            return out
        for _shard, item in engine.step().items:
            o = out[item.rid]
            o.tokens += item.token_ids
            o.logprobs += item.logprobs
            if item.finish_reason:
                o.finish_reason, o.error = item.finish_reason, item.error
    raise AssertionError(f"engine still busy after {max_steps} steps")
