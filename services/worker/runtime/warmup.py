"""A few prompts through a new engine before it serves, so no user request pays for a compile.

Triton compiles a kernel again for each new specialisation of its integer arguments (equal
to 1, divisible by 16, other), and cuBLAS settles its choice per new shape. On a fresh
H200 worker a lone 16-token prompt took 1.93 s to its first token where its neighbours took
about 25 ms: the first prompt whose token count was a multiple of
16. A prompt longer than one query block of the prefill kernel (64 tokens) is another: the
kernel's block count stops being 1 (1.56 s for the first 137-token prompt after the first
version of this warm-up). The warm-up runs prompts of 1, 16, 17 and 129 tokens alone, then
a batch of them with a prompt arriving while the others decode (a mixed step), each for a
few greedy tokens, and leaves the engine as it found it: nothing queued, every KV slot free,
the prompt cache empty. With the cache on, one prompt extends the 129-token one, so a prefill
over a cached prefix is compiled too.
Steps of up to a few thousand tokens replay CUDA graphs captured over padded token counts
(piecewise_graphs.py), so with those the warm-up adds two prompts just past the largest
bucket, 16 and 17 tokens past it: the steps that still run eagerly.
Last, prompts under a grammar (structured output), one alone and two together: the token
mask's kernel is compiled for one row and for more (the grammar itself is compiled in its
thread, with the tokenizer's vocabulary, and waited for).
Kernels that still compile while serving are logged by services/worker/kernels/launch.py.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from services.worker.engine import Engine
from shared.messages import CONSTRAINT_CHOICE, Constraint, GenerateReq, SamplingParams

log = logging.getLogger(__name__)

ALONE = (1, 16, 17, 129)  # prompt lengths run one at a time
TOGETHER = (16, 17, 33, 129)  # then these in one batch ...
LATE = 16  # ... and this one while they decode
CONSTRAINED = (1, 2)  # prompts under a grammar: one alone, then two together
CHOICE = Constraint(CONSTRAINT_CHOICE, '["yes", "no"]')
NEW_TOKENS = 4
GRAMMAR_WAIT_S = 600.0  # the vocabulary of a large tokenizer takes seconds to read


def _ids(k: int, length: int, vocab_size: int) -> list[int]:
    """Prompt k's ids; no two prompts start with the same token."""
    return [(7 + 31 * (k + i)) % vocab_size for i in range(length)]


def _request(k: int, ids: list[int], constraint: Constraint | None = None) -> GenerateReq:
    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, constraint=constraint)
    return GenerateReq(f"warmup-{k}", "warmup", "warmup", ids, params, time.time(), 0.0)


@dataclass
class WarmupReport:
    prompts: int = 0
    steps: int = 0
    mixed_steps: int = 0  # steps that ran a prefill beside decodes
    seconds: float = 0.0


def _step(engine: Engine, report: WarmupReport) -> None:
    out = engine.step()
    report.steps += 1
    report.mixed_steps += 0 < out.num_decodes < out.num_tokens


def _drain(engine: Engine, report: WarmupReport, max_steps: int = 1000) -> None:
    until = time.monotonic() + GRAMMAR_WAIT_S
    while not engine.has_work() and engine.compiling() and time.monotonic() < until:
        time.sleep(0.001)
    for _ in range(max_steps):
        if not engine.has_work():
            return
        _step(engine, report)
    raise RuntimeError(f"warm-up: the engine is still busy after {max_steps} steps")


def warm_up(engine: Engine, vocab_size: int) -> WarmupReport:
    """Run the warm-up prompts to completion."""
    t0 = time.perf_counter()
    free_before = engine.kv.free_tokens
    report = WarmupReport()

    # a prompt must leave room in the request's table row (the front end enforces this for users)
    longest = max(1, engine.scheduler.limits.max_total_len - NEW_TOKENS)

    def add(length: int, prefix: list[int] | None = None, constraint: Constraint | None = None) -> list[int]:
        ids = (prefix or []) + _ids(report.prompts, length, vocab_size)
        engine.add(_request(report.prompts, ids[:longest], constraint))
        report.prompts += 1
        return ids

    pieces = engine.runner.pieces
    eager = [pieces.buckets[-1] + extra for extra in (16, 17)] if pieces is not None else []
    for length in (*ALONE, *eager):
        ids = add(length)
        _drain(engine, report)
        if length == ALONE[-1] and engine.kv.cache is not None:
            add(ALONE[1], prefix=ids)  # a prefill over a cached prefix
            _drain(engine, report)
    for length in TOGETHER:
        add(length)
    for _ in range(2):  # the batch's prefill, then a decode step under way
        _step(engine, report)
    add(LATE)
    _drain(engine, report)
    # no tokenizer (a benchmark's random weights): no vocabulary to compile a grammar over
    for count in CONSTRAINED if os.path.isdir(engine.grammars.tokenizer_dir) else ():
        for _ in range(count):
            add(ALONE[1], constraint=CHOICE)
        _drain(engine, report)
    engine.kv.clear_cache()
    if engine.kv.free_tokens != free_before:
        raise RuntimeError(f"warm-up left {free_before - engine.kv.free_tokens} KV slots held")
    report.seconds = time.perf_counter() - t0
    log.info(
        "warm-up: %d prompts in %d steps (%d mixed), %.1fs",
        report.prompts,
        report.steps,
        report.mixed_steps,
        report.seconds,
    )
    return report
