"""Drive an Engine to completion without Redis, for tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from services.worker.engine import Engine
from shared.messages import GenerateReq, SamplingParams


@dataclass
class Outcome:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    logprobs: list[float] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens the prompt cache held when the request started


def request(rid: str, ids: list[int], **params) -> GenerateReq:
    return GenerateReq(rid, "front", "detok", ids, SamplingParams(**params), 0.0, 0.0)


def run(
    engine: Engine, reqs: list[GenerateReq], max_steps: int = 10_000, later: dict[int, list[GenerateReq]] | None = None
) -> dict[str, Outcome]:
    """later: requests added just before the given step (0 is the first)."""
    later = dict(later or {})
    out = {r.rid: Outcome() for r in [*reqs, *(r for rs in later.values() for r in rs)]}
    for r in reqs:
        engine.add(r)
    for step in range(max_steps):
        for r in later.pop(step, []):
            engine.add(r)
        while not engine.has_work() and engine.compiling():  # grammars compile in their thread
            time.sleep(0.001)
        if not engine.has_work() and not later:
            return out
        for _shard, item in engine.step().items:
            o = out.setdefault(item.rid, Outcome())  # a request added before the call, too
            o.tokens += item.token_ids
            o.logprobs += item.logprobs
            o.cached_tokens = max(o.cached_tokens, item.cached_tokens)
            if item.finish_reason:
                o.finish_reason, o.error = item.finish_reason, item.error
    raise AssertionError(f"engine still busy after {max_steps} steps")
