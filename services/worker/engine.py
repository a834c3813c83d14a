"""The engine: one step is schedule, launch (build batch, forward, sample), then collect.

Steps overlap: ``step()`` launches step N+1 before it collects step N, so the host
plans and builds the next batch while the device still runs the current one, and
the only wait is for a step whose successor is already queued. Sampled tokens come
back in one copy per step, into pinned buffers, when the device gets there. On the
CPU the same code runs with every launch finishing at once.

Structured output keeps the overlap: a constrained request decodes in every step. Its
token mask for step N+1 needs its token of step N, so a step with constrained requests
hands the mask to the mask thread, which waits for step N's tokens (the device runs N before
N+1 anyway), advances the requests' grammars with them and fills the mask on the host while
the step loop builds and launches N+1's forward and the device runs it. N+1 is then left
staged, its sampling not yet queued: the step loop collects N, the worker publishes its
tokens and reads its inbox, and the next ``step()`` plans N+2, all while the fill goes on; only
then does it wait for the mask, apply it to N+1's logits on the device, sample, and build and
launch N+2 (grammar.py, token_mask.py). A step without constrained requests does none of this.

The engine knows nothing of Redis: the worker service feeds it admitted requests and
aborts, and publishes what each step returns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from services.worker import prompt_logprobs
from services.worker.batch_builder import PreviousTokens, build_batch
from services.worker.grammar import Grammars, grammar_threads
from services.worker.memory.kv_manager import KVManager
from services.worker.prompt_logprobs import PromptResult, PromptRows
from services.worker.request import ImageSpan, Req
from services.worker.runtime.model_runner import ModelRunner
from services.worker.sampler import SampleBatch, Sampler, SampleResult
from services.worker.scheduler import Scheduler
from services.worker.token_mask import Filling, TokenMasks
from shared.messages import (
    ERR_FAILED,
    ERR_INVALID,
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_STOP,
    GenerateReq,
    RunningTable,
    TokenItem,
)

log = logging.getLogger(__name__)


@dataclass
class StepOutput:
    items: list[tuple[str, TokenItem]]  # (detokenizer shard, item)
    num_tokens: int  # tokens the model ran in the step launched now
    num_decodes: int  # of which decode tokens
    changed: bool  # a request ended (its KV is free) or produced its first token


@dataclass
class InFlight:
    """A launched step whose tokens have not been read yet."""

    sampled: list[Req]
    positions: list[int]  # index of each request's placeholder in its tokens
    result: SampleResult  # on the device
    host: SampleResult  # the copy being made to the host
    event: torch.cuda.Event | None
    tokens: list[int] | None = None  # the sampled tokens on the host, once read
    prompt: tuple[PromptRows, PromptResult] | None = None  # prompt logprobs, copied with the tokens

    def previous_tokens(self) -> PreviousTokens:
        return PreviousTokens(self.result.tokens, {id(r): i for i, r in enumerate(self.sampled)})

    def host_tokens(self) -> list[int]:
        """The sampled tokens, read once the copy to the host is done (waiting for it)."""
        if self.tokens is None:
            if self.event is not None:
                self.event.synchronize()
            self.tokens = self.host.tokens.tolist()
        return self.tokens


@dataclass
class Staged:
    """A launched forward whose sampling waits for its constrained requests' token mask."""

    sampled: list[Req]
    positions: list[int]
    logits: torch.Tensor  # [S, V] on the device
    sample_batch: SampleBatch
    filling: Filling | None
    prompt: tuple[PromptRows, PromptResult] | None = None  # prompt logprobs, on the device


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        kv: KVManager,
        scheduler: Scheduler,
        sampler: Sampler,
        device: torch.device,
        grammars: Grammars,
        mask_fill_threads: int | None = None,
    ) -> None:
        self.runner = runner
        self.kv = kv
        self.scheduler = scheduler
        self.sampler = sampler
        self.device = device
        self.grammars = grammars
        self.masks: TokenMasks | None = None  # made at the first constrained step
        self.mask_fill_threads = mask_fill_threads or grammar_threads()
        self.inflight: InFlight | None = None
        self.staged: Staged | None = None  # launched, its sampling waiting for its token mask
        self._admitted = 0
        self.steps = 0

    # ---------------------------------------------------------------- requests in

    def add(self, msg: GenerateReq, images: list[ImageSpan] | None = None) -> None:
        """images: the embeddings of msg.images, in order (the worker service reads them)."""
        self._admitted += 1
        req = Req(msg, self._admitted, images)
        if msg.params.constraint is not None:
            req.grammar = self.grammars.state(msg.params.constraint, req.prompt_len)
        self.scheduler.add(req)

    def abort(self, rid: str, reason: str = FINISH_ABORT) -> bool:
        return self.scheduler.abort(rid, reason) is not None

    def has_work(self) -> bool:
        busy = self.inflight is not None or self.staged is not None
        return busy or self.scheduler.has_work() or bool(self.scheduler.finished)

    def compiling(self) -> bool:
        """Requests wait for their grammars to compile (and nothing else may be to do)."""
        return bool(self.scheduler.compiling)

    # ---------------------------------------------------------------- one step

    def step(self) -> StepOutput:
        self.scheduler.expire(time.time())
        plan = self.scheduler.schedule()
        if self.staged is not None:  # its mask was filled while the host did the rest
            assert self.inflight is None
            self.inflight, self.staged = self._sample(self.staged), None
        launched = None
        num_tokens = sum(n for _, n in plan.extends) + len(plan.decodes)
        if not plan.empty:
            launched = self._launch(plan)
        items: list[tuple[str, TokenItem]] = []
        first_tokens = False
        if self.inflight is not None:
            if isinstance(launched, Staged) and launched.filling is not None:
                launched.filling.advanced.result()  # the grammars took the tokens collected here
            items, first_tokens = self._collect(self.inflight)
        self.inflight, self.staged = (None, launched) if isinstance(launched, Staged) else (launched, None)
        finished = self.scheduler.take_finished()
        items += [(r.detok, _item(r, None, None, None)) for r in finished]
        changed = first_tokens or bool(finished) or any(item.finish_reason for _, item in items)
        return StepOutput(items, num_tokens, len(plan.decodes), changed)

    def _launch(self, plan) -> InFlight | Staged:
        """Build and launch the step's forward; sample it at once, or, with constrained requests,
        leave it staged: its sampling waits for their mask, which the mask thread fills while
        this step collects the one before and the next is planned (``step``)."""
        self.sampler.state.assign(plan.new_rows)
        sampled = plan.sampled()
        filling = self._begin_mask(sampled) if self.scheduler.constrained else None
        prev = self.inflight.previous_tokens() if self.inflight is not None else None
        rows = PromptRows.of(plan.extends)  # prompt-logprob rows, after the sampled ones
        batch = build_batch(plan, self.kv.table.table, self.device, prev, self.runner.staging, rows)
        sample_batch = self.sampler.batch(sampled, self.device, batch.sample_rows)
        logits = self.runner.forward(batch)  # [S, V], then the prompt rows'
        prompt = None
        if rows is not None:
            prompt = (rows, prompt_logprobs.compute(logits[len(sampled) :], rows))
            logits = logits[: len(sampled)]
        positions = self.scheduler.launched(plan, sampled)
        self.steps += 1
        staged = Staged(sampled, positions, logits, sample_batch, filling, prompt)
        return staged if filling is not None else self._sample(staged)

    def _sample(self, s: Staged) -> InFlight:
        if s.filling is not None and self.masks is not None and (mask := self.masks.finish(s.filling)) is not None:
            mask.apply(s.logits)
        result = self.sampler.sample(s.logits, s.sample_batch)
        prompt = None
        if s.prompt is not None:  # copied before the event the tokens' copy records
            rows, r = s.prompt
            prompt = (rows, PromptResult(*(self._pinned(t) for t in (r.chosen, r.ranks, r.top_ids, r.top_values))))
        host, event = self._copy_to_host(result)
        return InFlight(s.sampled, s.positions, result, host, event, prompt=prompt)

    def _begin_mask(self, sampled: list[Req]) -> Filling | None:
        """Fill the bitmask rows of this step's constrained requests in the mask thread while this
        one builds and launches the forward. Their last tokens may be in the step in flight: the
        thread waits for it (it is queued ahead of this one's forward, so the device loses
        nothing) and advances their grammars first."""
        constrained = [(i, r.grammar) for i, r in enumerate(sampled) if r.grammar is not None]
        if not constrained:
            return None
        if self.masks is None:
            limits, vocab = self.scheduler.limits, self.sampler.state.vocab
            self.masks = TokenMasks(limits.max_running, vocab, self.device, self.mask_fill_threads)
        inflight = self.inflight
        return self.masks.begin(lambda: _advance_grammars(inflight), constrained)

    def _pinned(self, t: torch.Tensor | None) -> torch.Tensor | None:
        """A copy of t on its way to pinned host memory (t itself on the CPU)."""
        if t is None or self.device.type != "cuda":
            return t
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        return out

    def _copy_to_host(self, r: SampleResult) -> tuple[SampleResult, torch.cuda.Event | None]:
        if self.device.type != "cuda":
            return r, None
        host = self._pinned
        copied = SampleResult(host(r.tokens), host(r.logprobs), host(r.top_ids), host(r.top_values))
        event = torch.cuda.Event()
        event.record()
        return copied, event

    def _collect(self, f: InFlight) -> tuple[list[tuple[str, TokenItem]], bool]:
        tokens = f.host_tokens()
        if f.prompt is not None:  # before the items: a request's first token carries them
            prompt_logprobs.collect(*f.prompt)
        logprobs = f.host.logprobs.tolist() if f.host.logprobs is not None else None
        top_ids = f.host.top_ids.tolist() if f.host.top_ids is not None else None
        top_values = f.host.top_values.tolist() if f.host.top_values is not None else None
        items = []
        first = False
        for i, (req, pos, tok) in enumerate(zip(f.sampled, f.positions, tokens, strict=True)):
            end = _grammar_end(req, pos, tok) if req.grammar is not None and not req.finish_reason else ""
            if not self.scheduler.resolve(req, pos, tok, end):
                continue  # it ended while this step was in flight
            p = req.params
            lp = [logprobs[i]] if logprobs is not None and (p.logprobs or p.top_logprobs) else []
            top = None
            if top_ids is not None and top_values is not None and p.top_logprobs:
                k = p.top_logprobs
                top = [[[float(t), v] for t, v in zip(top_ids[i][:k], top_values[i][:k], strict=True)]]
            produced = pos - req.prompt_len + 1
            first |= produced == 1
            items.append((req.detok, _item(req, tok, lp, top, produced)))
        return items, first

    # ---------------------------------------------------------------- state out

    def running_reqs(self) -> RunningTable:
        """Every request held (running, waiting to start or paused), for the router, and those
        whose last token is in flight: a request leaves the status only once its end has gone
        out, so the router can take its absence for its end (docs/router.md, Failures)."""
        reqs = self.scheduler.all_requests()
        for f in (self.inflight, self.staged):
            if f is not None:
                reqs += [r for r in f.sampled if r.closing and not r.finish_reason]
        waiting = {id(r) for r in self.scheduler.waiting}
        return RunningTable(
            [r.rid for r in reqs],
            [r.detok for r in reqs],
            [r.prompt_len for r in reqs],
            [len(r.tokens) for r in reqs],
            [r.remaining for r in reqs],
            [id(r) in waiting and r.output_len > 0 for r in reqs],
            [r.cached_len for r in reqs],
        )

    def fail_all(self, why: str) -> list[tuple[str, TokenItem]]:
        """End every request with an explicit error (the worker is going away)."""
        pending = list(self.scheduler.all_requests())
        for f in (self.inflight, self.staged):
            if f is not None:
                pending += [r for r in f.sampled if r.closing and not r.finish_reason]
        self.inflight = self.staged = None
        for req in pending:
            req.error = why
            req.error_kind = ERR_FAILED
            if not self.scheduler.abort(req.rid, FINISH_ERROR):
                req.finish_reason = FINISH_ERROR
                self.scheduler.finished.append(req)
        return [(r.detok, _item(r, None, None, None)) for r in self.scheduler.take_finished()]


def _advance_grammars(f: InFlight | None) -> None:
    """The grammars of a step's requests take its tokens (waiting for them)."""
    if f is None:
        return
    for req, pos, tok in zip(f.sampled, f.positions, f.host_tokens(), strict=True):
        if req.grammar is not None:
            req.grammar.advance(pos, tok)


def _grammar_end(req: Req, pos: int, tok: int) -> str:
    """How the request's grammar ends it with this token: "stop" (the grammar accepted an end
    token), "error" (the token broke it) or "" (it goes on)."""
    g = req.grammar
    assert g is not None
    g.advance(pos, tok)
    if g.rejected >= 0:
        # the mask allows the grammar's tokens only: the sampler drew another when it allowed none
        # the sampler could take (end tokens banned by min_new_tokens, say)
        req.error = (
            f"the output format allowed no token the request's parameters let be chosen (token {g.rejected} "
            "was drawn): an end token before min_tokens?"
        )
        req.error_kind = ERR_INVALID
        return FINISH_ERROR
    return FINISH_STOP if g.ended else ""


def _item(
    req: Req, token: int | None, logprobs: list[float] | None, top: list | None, produced: int | None = None
) -> TokenItem:
    """The report of one request for one step: its new token (if any) and its end (if any); with
    its first token, its prompt logprobs when it asked for them."""
    first = produced == 1 and req.params.prompt_logprobs >= 0
    return TokenItem(
        rid=req.rid,
        token_ids=[token] if token is not None else [],
        logprobs=logprobs or [],
        top_logprobs=top or [],
        finish_reason=req.finish_reason,
        error=req.error,
        error_kind=req.error_kind,
        prompt_tokens=req.prompt_len,
        output_tokens=produced if produced is not None else req.output_len - req.unresolved,
        cached_tokens=req.cached_prompt,
        handovers=req.handovers,
        prompt_logprobs=req.prompt_lp if first else [],
        prompt_top_logprobs=req.prompt_top if first else [],
        prompt_ranks=req.prompt_ranks if first else [],
    )
