"""Prompt logprobs: each prompt token's log-probability under the model given the tokens before
it (OpenAI's completions with echo and logprobs, as lm-eval's loglikelihood tasks ask; vLLM's
prompt_logprobs), with the most likely alternatives when asked.

A prefill chunk's position p predicts the prompt token at p + 1, so the rows of a request's chunk
that hold prompt positions 0 .. prompt_len - 2 are extra rows of the step's logits, after the
sampled ones (the model computes logits for the rows it is given: batch_builder appends these to
sample_index). Their log-softmax is the model's own distribution, before any sampling parameter.
The request's ``prompt_lp_next`` is the first prompt position whose row no launched step has
computed: it moves on at launch, so a paused request that runs its prompt again does not compute
those rows twice; the values gather in the request as steps are collected, in position order, and
go to the client with its first output token. A request that still owes rows takes no prefix
from the prompt cache (the cached positions would have no logits), and a step computes at most
MAX_ROWS of them (the scheduler shortens such a request's chunk), which bounds the logits' memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.worker.host_copy import to_device
from services.worker.request import Req

MAX_ROWS = 2048  # prompt-logprob rows a step computes, over its requests: [MAX_ROWS, V] logits
SLICE = 512  # rows whose float32 log-softmax is formed at once


def wants(req: Req) -> bool:
    """Whether the request still owes prompt-logprob rows."""
    return req.prompt_lp_next < req.prompt_len - 1


def rows_in(req: Req, start: int, n: int) -> range:
    """The prompt positions among [start, start + n) whose rows the request still owes."""
    if not wants(req):
        return range(0)
    return range(max(start, req.prompt_lp_next), max(min(start + n, req.prompt_len - 1), req.prompt_lp_next))


def capped(req: Req, n: int, rows_left: int) -> int:
    """n shortened so that the request's chunk from its kv_len has at most rows_left rows."""
    if not wants(req):
        return n
    end = max(req.kv_len, req.prompt_lp_next) + rows_left  # the first position past the rows allowed
    return n if end >= req.prompt_len - 1 else max(0, min(n, end - req.kv_len))


def launched(req: Req, start: int, n: int) -> None:
    """A launched chunk [start, start + n) computes its rows: later steps owe only the rest."""
    owed = rows_in(req, start, n)
    if owed:
        req.prompt_lp_next = owed.stop


@dataclass
class PromptRows:
    """The step's prompt-logprob rows: their packed positions, the prompt token each predicts, and
    which request owns how many of them (in order)."""

    index: list[int] = field(default_factory=list)
    next_ids: list[int] = field(default_factory=list)
    owners: list[tuple[Req, int]] = field(default_factory=list)
    top_k: int = 0  # the most alternatives any owner asks for

    @classmethod
    def of(cls, extends: list[tuple[Req, int]]) -> PromptRows | None:
        """Rows of the step's extends, laid out as batch_builder packs them (extends first, in order)."""
        rows, start = cls(), 0
        for req, n in extends:
            owed = rows_in(req, req.kv_len, n)
            if owed:
                rows.index.extend(start + p - req.kv_len for p in owed)
                rows.next_ids.extend(req.tokens[p + 1] for p in owed)
                rows.owners.append((req, len(owed)))
                rows.top_k = max(rows.top_k, req.params.prompt_logprobs)
            start += n
        return rows if rows.owners else None


@dataclass
class PromptResult:
    """The rows' logprobs of the token that follows, and their top_k alternatives (ids, logprobs)."""

    chosen: torch.Tensor  # [P] float32
    ranks: torch.Tensor  # [P] int64: the following token's rank in the vocabulary (1: the most likely)
    top_ids: torch.Tensor | None  # [P, top_k] int64
    top_values: torch.Tensor | None


def compute(logits: torch.Tensor, rows: PromptRows) -> PromptResult:
    """logits [P, V] of the rows, in order -> their logprobs, SLICE rows at a time in float32."""
    p = logits.shape[0]
    next_ids = to_device(rows.next_ids, torch.int64, logits.device)
    chosen = torch.empty(p, dtype=torch.float32, device=logits.device)
    ranks = torch.empty(p, dtype=torch.int64, device=logits.device)
    k = rows.top_k
    top_ids = torch.empty(p, k, dtype=torch.int64, device=logits.device) if k else None
    top_values = torch.empty(p, k, dtype=torch.float32, device=logits.device) if k else None
    for s in range(0, p, SLICE):
        lp = torch.log_softmax(logits[s : s + SLICE].float(), dim=-1)
        chosen[s : s + SLICE] = lp.gather(1, next_ids[s : s + SLICE, None]).squeeze(1)
        ranks[s : s + SLICE] = (lp > chosen[s : s + SLICE, None]).sum(dim=-1) + 1
        if top_ids is not None and top_values is not None:
            torch.topk(lp, k, dim=-1, out=(top_values[s : s + SLICE], top_ids[s : s + SLICE]))
    return PromptResult(chosen, ranks, top_ids, top_values)


def collect(rows: PromptRows, result: PromptResult) -> None:
    """The step's values (on the host) join their requests' prompt logprobs, in position order."""
    chosen, ranks = result.chosen.tolist(), result.ranks.tolist()
    ids = result.top_ids.tolist() if result.top_ids is not None else None
    values = result.top_values.tolist() if result.top_values is not None else None
    at = 0
    for req, count in rows.owners:
        req.prompt_lp.extend(chosen[at : at + count])
        req.prompt_ranks.extend(ranks[at : at + count])
        k = req.params.prompt_logprobs
        if k and ids is not None and values is not None:
            req.prompt_top.extend(
                [[float(t), v] for t, v in zip(ids[i][:k], values[i][:k], strict=True)] for i in range(at, at + count)
            )
        at += count
