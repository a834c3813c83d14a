"""The prompt cache's workloads through the engine alone: tools/benchmark_engine.py's parts

  shared_prefix       every request of the shared-prefix workload at once: requests/s
  shared_prefix_rate  the same requests arriving as a Poisson process at --shared-prefix-rate a
                      second: time to first token from each request's arrival
  multi_turn          every conversation's first turn at once; a turn's reply (its output token
                      ids) and the next user message are appended to the history and the next
                      turn is added as soon as the turn before it finishes (closed loop)

Requests are added to the engine when their time has come, and the engine is stepped
otherwise, as the worker service does. Output lengths are the workload's (ignore_eos). The hit
rate is the prompt tokens the prompt cache served over all prompt tokens, from each request's
TokenItem.cached_tokens.
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.worker.engine import Engine
from shared.messages import GenerateReq, SamplingParams, TokenItem
from tools.bench_workloads import (
    Conversation,
    arrival_times,
    conversations,
    hit_rate,
    latency_ms,
    shared_prefix_requests,
)
from tools.workload import random_prompts

PARTS = ("shared_prefix", "shared_prefix_rate", "multi_turn")

Arrival = tuple[float, str, list[int], int]  # (seconds after the start, rid, prompt ids, output length)
NextTurn = Callable[[str, list[int]], tuple[str, list[int], int] | None]  # (rid, reply) -> the next request


def request(rid: str, ids: list[int], max_new: int) -> GenerateReq:
    """A benchmark request: greedy, exactly max_new output tokens."""
    return GenerateReq(rid, "bench", "bench", ids, SamplingParams(max_new_tokens=max_new, ignore_eos=True), 0.0, 0.0)


@dataclass
class Record:
    prompt_tokens: int
    expected_output: int
    start: float  # perf_counter seconds: its arrival, or when the turn before it finished
    first: float = 0.0  # when its first token came back
    end: float = 0.0
    output: list[int] = field(default_factory=list)
    cached: int = 0  # prompt tokens the prompt cache held when it started
    error: str = ""


def observe(recs: dict[str, Record], items: list[tuple[str, TokenItem]], now: float) -> list[str]:
    """A step's items into the records; -> the requests that finished in it."""
    done = []
    for _, item in items:
        r = recs.get(item.rid)
        if r is None or r.end:
            continue  # a warm-up request, or a second report of an end
        if item.token_ids:
            r.output += item.token_ids
            r.first = r.first or now
        r.cached = max(r.cached, item.cached_tokens)
        if item.finish_reason:
            r.end, r.error = now, item.error
            done.append(item.rid)
    return done


def drive(engine: Engine, arrivals: list[Arrival], then: NextTurn | None = None) -> tuple[dict[str, Record], float]:
    """Run the arrivals (and the turns `then` adds) to the end; -> (records, seconds)."""
    recs: dict[str, Record] = {}
    pending = deque(sorted(arrivals, key=lambda a: a[0]))
    begin = time.perf_counter()

    def add(rid: str, ids: list[int], out_len: int, at: float) -> None:
        recs[rid] = Record(len(ids), out_len, at)
        engine.add(request(rid, ids, out_len))

    while pending or engine.has_work():
        now = time.perf_counter()
        while pending and begin + pending[0][0] <= now:
            at, rid, ids, out_len = pending.popleft()
            add(rid, ids, out_len, begin + at)
        if not engine.has_work():
            time.sleep(max(0.0, begin + pending[0][0] - time.perf_counter()))
            continue
        items = engine.step().items
        now = time.perf_counter()
        for rid in observe(recs, items, now):
            nxt = then(rid, recs[rid].output) if then is not None and not recs[rid].error else None
            if nxt is not None:
                add(*nxt, now)
    return recs, time.perf_counter() - begin


def summarize(recs: dict[str, Record], seconds: float) -> dict:
    done = [r for r in recs.values() if r.end and not r.error]
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached for r in done)
    out = sum(len(r.output) for r in done)
    tpot = [(r.end - r.first) / (len(r.output) - 1) for r in done if len(r.output) > 1]
    return {
        "requests": len(recs),
        "completed": len(done),
        "failed": len(recs) - len(done),
        "errors": sorted({r.error for r in recs.values() if r.error})[:5],
        "seconds": seconds,
        "req_per_s": len(done) / seconds,
        "output_tok_per_s": out / seconds,
        "output_tokens": out,
        "expected_output_tokens": sum(r.expected_output for r in done),
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "hit_rate": hit_rate(prompt, cached),
        "ttft_ms": latency_ms([r.first - r.start for r in done]),
        "tpot_ms": latency_ms(tpot),
    }


def warm(engine: Engine, vocab: int) -> None:
    """A few short requests through every kind of step, none a prefix of a timed one."""
    for k, ids in enumerate(random_prompts([32] * 8, vocab, seed=99)):
        engine.add(request(f"warm{k}", ids, 8))
    while engine.has_work():
        engine.step()


def shared_prefix(engine: Engine, vocab: int, args: argparse.Namespace, rate: float) -> dict:
    reqs = shared_prefix_requests(args, vocab)
    times = arrival_times(len(reqs), rate)
    warm(engine, vocab)
    recs, seconds = drive(
        engine, [(t, f"p{k}", ids, n) for k, (t, (ids, n)) in enumerate(zip(times, reqs, strict=True))]
    )
    return {"request_rate": "inf" if rate == float("inf") else rate, **summarize(recs, seconds)}


def multi_turn(engine: Engine, vocab: int, args: argparse.Namespace) -> dict:
    convs = [Conversation(turns) for turns in conversations(args, vocab)]

    def then(rid: str, reply: list[int]) -> tuple[str, list[int], int] | None:
        i = int(rid[1 : rid.index("-")])
        c = convs[i]
        return (f"c{i}-{c.turn}", c.prompt, c.output_len) if c.advance(reply) else None

    warm(engine, vocab)
    recs, seconds = drive(engine, [(0.0, f"c{i}-0", c.prompt, c.output_len) for i, c in enumerate(convs)], then)
    turns = sum(len(c.turns) for c in convs)
    return {"conversations": len(convs), "turns": turns, **summarize(recs, seconds)}


def run_part(part: str, engine: Engine, vocab: int, args: argparse.Namespace) -> dict:
    if part == "shared_prefix":
        return shared_prefix(engine, vocab, args, float("inf"))
    if part == "shared_prefix_rate":
        return shared_prefix(engine, vocab, args, args.shared_prefix_rate)
    return multi_turn(engine, vocab, args)


def on_over_off(on: dict, off: dict) -> dict:
    """Each part both settings ran: its throughput with the prompt cache on over off."""
    out = {}
    for part, a in on.items():
        b = off.get(part)
        if isinstance(a, dict) and isinstance(b, dict) and a.get("req_per_s") and b.get("req_per_s"):
            out[part] = {k: a[k] / b[k] for k in ("req_per_s", "output_tok_per_s") if b.get(k)}
    return out
