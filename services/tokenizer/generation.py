"""One generation from the front end's side: check, submit, wait for text, clean up.

Every route (LightLLM, OpenAI) goes through here, so limits, deadlines, metrics and
aborts behave the same everywhere. A request with n > 1 (or best_of > 1) is several
generations, submitted together; fanout.py waits on them as one.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from dataclasses import dataclass

from services.tokenizer.errors import APIError
from services.tokenizer.images.front import ImageFront, PromptImages
from services.tokenizer.metrics import FrontMetrics
from services.tokenizer.pipeline import PendingRequest, Pipeline, Unavailable
from services.tokenizer.tokenization import Tokenization
from shared.config import TokenizerConfig
from shared.log import request_id
from shared.messages import ERR_DEADLINE, FINISH_ABORT, FINISH_ERROR, SamplingParams, TextItem

log = logging.getLogger(__name__)

SEED_LIMIT = 2**63  # seeds travel as int64


@dataclass
class FrontContext:
    cfg: TokenizerConfig
    pipeline: Pipeline
    tok: Tokenization
    max_total_len: int  # prompt + output tokens per request
    model_name: str
    vocab_size: int  # token ids a client may send are below this
    metrics: FrontMetrics
    started: float  # unix time the front end started, for /v1/models' "created"
    images: ImageFront  # requests' images: refused for a text-only model


@dataclass(frozen=True)
class Job:
    """One generation to run: a prompt and how to continue it."""

    prompt_ids: list[int]
    params: SamplingParams
    stops: list[str]
    skip_special_tokens: bool
    images: PromptImages | None = None  # the prompt's images (their positions are in prompt_ids)


@dataclass
class Generation:
    """A submitted job, with the times its metrics are measured from."""

    pending: PendingRequest
    arrival: float  # monotonic: when the HTTP request reached its route
    submitted: float  # monotonic: when it was handed to the pipeline
    first_item: float = 0.0
    first_token: float = 0.0
    ended: bool = False  # its last item came, or it was abandoned
    cached_tokens: int = 0  # prompt tokens the prompt cache held when it started, once an item said


def new_seed() -> int:
    return secrets.randbits(63)


def seeds(given: int | None, count: int) -> list[int]:
    """Seeds for count generations: consecutive from the client's seed (reproducible), else random."""
    base = new_seed() if given is None else given % SEED_LIMIT
    return [(base + i) % SEED_LIMIT for i in range(count)]


async def submit_all(
    ctx: FrontContext,
    jobs: list[Job],
    arrival: float,
    max_tokens_name: str = "max_new_tokens",
    prompt_name: str = "inputs",
) -> list[Generation]:
    """Check each job against the model's limits, then send them all down the pipeline."""
    for job in jobs:
        _check_limits(ctx, job, max_tokens_name, prompt_name)
    base = uuid.uuid4().hex
    request_id.set(base)
    rids = [base] if len(jobs) == 1 else [f"{base}-{i}" for i in range(len(jobs))]
    deadline = time.time() + ctx.cfg.request_timeout_s
    submitted = time.monotonic()
    queue: asyncio.Queue[tuple[int, TextItem]] = asyncio.Queue()  # every generation's items, tagged
    submits = [
        ctx.pipeline.submit(rid, j.prompt_ids, j.params, j.stops, j.skip_special_tokens, deadline, queue, i, j.images)
        for i, (rid, j) in enumerate(zip(rids, jobs, strict=True))
    ]
    if len(submits) == 1:  # no task for a lone generation: it leaves in this turn of the loop
        try:
            results: list = [await submits[0]]
        except Exception as e:
            results = [e]
    else:
        results = await asyncio.gather(*submits, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        for r in results:
            if isinstance(r, PendingRequest):
                ctx.pipeline.abort(r.rid, "a sibling generation could not be submitted")
        if isinstance(failed[0], Unavailable):
            e = failed[0]
            raise APIError(
                503, f"the service cannot take requests now: {e}", "unavailable", {"Retry-After": "1"}
            ) from e
        raise failed[0]
    gens = [Generation(p, arrival, submitted) for p in results if isinstance(p, PendingRequest)]
    ctx.metrics.in_flight.inc(len(gens))
    ctx.metrics.prompt_tokens.inc(sum(len(j.prompt_ids) for j in jobs))
    log.info(
        "submitted: generations=%d prompt_tokens=%d max_new_tokens=%d",
        len(jobs),
        len(jobs[0].prompt_ids),
        jobs[0].params.max_new_tokens,
    )
    return gens


def _check_limits(ctx: FrontContext, job: Job, max_tokens_name: str, prompt_name: str) -> None:
    if not job.prompt_ids:
        raise APIError(400, f"{prompt_name}: the prompt is empty: it has no tokens", param=prompt_name)
    total = len(job.prompt_ids) + job.params.max_new_tokens
    if total > ctx.max_total_len:
        of_images = f" ({job.images.tokens} of them its images')" if job.images is not None else ""
        raise APIError(
            400,
            f"the prompt has {len(job.prompt_ids)} tokens{of_images} and {max_tokens_name} is "
            f"{job.params.max_new_tokens}: {total} tokens exceed the model's limit of {ctx.max_total_len}",
            "context_length_exceeded",
            param=max_tokens_name,
        )


def accept(ctx: FrontContext, gen: Generation, item: TextItem) -> bool:
    """Count an item of gen that came from the pipeline: its metrics, and its end. False when
    gen has ended already (an item that was in flight when it was aborted or timed out)."""
    if gen.ended:
        return False
    now = time.monotonic()
    if not gen.first_item:
        gen.first_item = now
        ctx.metrics.queue_time.observe(now - gen.submitted)
    if item.token_ids and not gen.first_token:
        gen.first_token = now
        ctx.metrics.ttft.observe(now - gen.arrival)
    if item.cached_tokens and not gen.cached_tokens:  # every item of a generation carries the same count
        gen.cached_tokens = item.cached_tokens
        ctx.metrics.cached_prompt_tokens.inc(item.cached_tokens)
    if item.finish_reason:
        gen.ended = True
        ctx.pipeline.done(gen.pending.rid)
        _ended(ctx, gen, item.finish_reason, item.output_tokens, now)
    return True


def expire(ctx: FrontContext, gens: list[Generation]) -> None:
    """The request's deadline passed (a timer calls this): each generation still running is
    aborted and gets an explicit error item, so its reader ends with a deadline error."""
    for gen in gens:
        if gen.ended:
            continue
        pending = gen.pending
        ctx.pipeline.abort(pending.rid, "deadline exceeded")
        error = TextItem(
            pending.rid,
            "",
            finish_reason=FINISH_ERROR,
            error="deadline exceeded",
            error_kind=ERR_DEADLINE,
            prompt_tokens=pending.prompt_tokens,
        )
        pending.queue.put_nowait((pending.index, error))


def deadline_s(ctx: FrontContext) -> float:
    """How long after submission a front end waits for a request before failing it itself:
    the pipeline's own deadline, plus time for its error to come back."""
    return ctx.cfg.request_timeout_s + 5.0


def abandon(ctx: FrontContext, gens: list[Generation]) -> None:
    """Abort the generations that have not ended: nobody will read them. Does not wait, so it
    is safe in a cancelled task; the aborts go out from the pipeline's I/O pool."""
    for gen in gens:
        if not gen.ended:
            gen.ended = True
            ctx.pipeline.abort(gen.pending.rid, "client disconnected")
            _ended(ctx, gen, FINISH_ABORT, 0, time.monotonic())


def _ended(ctx: FrontContext, gen: Generation, reason: str, output_tokens: int, now: float) -> None:
    m = ctx.metrics
    m.in_flight.dec()
    m.generations.labels(reason).inc()
    if reason in (FINISH_ERROR, FINISH_ABORT):
        return
    m.latency.observe(now - gen.arrival)
    m.output_tokens.inc(output_tokens)
    if output_tokens > 1 and gen.first_token:
        m.tpot.observe((now - gen.first_token) / (output_tokens - 1))
