"""StepPlan -> ForwardBatch: lay the step's tokens out packed and move them to the device.

A decoding request's last token may still be in flight (sampled by the step before,
not yet copied to the host): its input id is then taken on the device from that step's
sampled tokens, so building the next step never waits for the previous one.

A decode-only batch for the decode graphs is built in their input layout instead
(runtime/graph_inputs.py): one copy and one kernel, where the general path takes about a dozen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from services.worker.forward_batch import ForwardBatch, HostIndex
from services.worker.host_copy import to_device
from services.worker.prompt_logprobs import PromptRows
from services.worker.request import PLACEHOLDER, Req
from services.worker.scheduler import StepPlan

if TYPE_CHECKING:
    from services.worker.runtime.graph_inputs import DecodeInputs


@dataclass
class PreviousTokens:
    """The sampled tokens of the step in flight, for inputs that are still placeholders."""

    tokens: torch.Tensor  # [S] int64 on the device
    index: dict[int, int]  # id(request) -> its row in tokens


@dataclass
class _Packed:
    """The step's token lists as the host lays them out, before they go to the device."""

    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    ext_rows: list[int] = field(default_factory=list)
    ext_starts: list[int] = field(default_factory=list)
    ext_lens: list[int] = field(default_factory=list)
    ext_prefix: list[int] = field(default_factory=list)
    dec_rows: list[int] = field(default_factory=list)
    dec_lens: list[int] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)
    from_prev: list[tuple[int, int]] = field(default_factory=list)  # (packed position, row in prev.tokens)
    num_extend: int = 0
    image_positions: list[int] = field(default_factory=list)  # packed positions an image's rows fill
    image_rows: list[torch.Tensor] = field(default_factory=list)  # those rows, in order, [n_i, H] each
    rope: tuple[list[int], list[int], list[int]] = field(default_factory=lambda: ([], [], []))  # M-RoPE's t, h, w


def build_batch(
    plan: StepPlan,
    req_table: torch.Tensor,
    device: torch.device,
    prev: PreviousTokens | None = None,
    staging: DecodeInputs | None = None,
    prompt_rows: PromptRows | None = None,
) -> ForwardBatch:
    """staging: the decode graphs' input layout; a decode-only batch that fits it is built there
    (one copy and one kernel, graph_inputs.py). Either way the decodes' new slots
    (plan.decode_slots, which the scheduler does not record) are written into req_table at
    (row, position). prompt_rows: packed positions whose logits follow the sampled ones'
    (prompt logprobs, prompt_logprobs.py; only steps with prompt tokens have them)."""
    fits = staging is not None and plan.decode_slots is not None and staging.fits(len(plan.decodes))
    if fits and not plan.extends:  # M-RoPE's decodes too: the layout carries their rotary positions
        return _staged(plan, req_table, staging, prev)
    mrope = any(r.rope is not None for r, _ in plan.extends) or any(r.rope is not None for r in plan.decodes)
    k = _pack(plan, prev, mrope, prompt_rows)
    slots = list(plan.extend_slots)
    if plan.decode_slots is not None:
        slots.append(plan.decode_slots)

    def i32(values: list[int]) -> torch.Tensor:
        return to_device(values, torch.int32, device)

    def i64(values: list[int]) -> torch.Tensor:
        return to_device(values, torch.int64, device)

    input_ids = i64(k.ids)
    if k.from_prev:
        assert prev is not None
        where = to_device(k.from_prev, torch.int64, device)
        input_ids[where[:, 0]] = prev.tokens[where[:, 1]]
    positions = i64(k.pos)
    decode_rows = i32(k.dec_rows)
    if plan.decode_slots is not None:  # the decodes' new slots, which the scheduler leaves to the batch
        req_table[decode_rows.long(), positions[k.num_extend :]] = plan.decode_slots
    return ForwardBatch(
        input_ids=input_ids,
        positions=positions,
        out_slots=torch.cat(slots) if slots else i32([]),
        req_table=req_table,
        num_extend_tokens=k.num_extend,
        extend_rows=i32(k.ext_rows),
        extend_starts=i32(k.ext_starts),
        extend_lens=i32(k.ext_lens),
        extend_prefix_lens=i32(k.ext_prefix),
        extend_max_len=max(k.ext_lens, default=0),
        extend_lens_host=k.ext_lens,
        extend_prefix_lens_host=k.ext_prefix,
        decode_rows=decode_rows,
        decode_seq_lens=i32(k.dec_lens),
        decode_max_len=max(k.dec_lens, default=0),
        sample_index=i64(k.sample_index),
        rope_positions=to_device(list(k.rope), torch.int64, device) if mrope else None,
        host=HostIndex(k.pos, k.ext_rows, k.ext_starts, k.dec_rows, k.dec_lens, k.sample_index),
        image_positions=i64(k.image_positions) if k.image_rows else None,
        image_embeds=torch.cat(k.image_rows) if k.image_rows else None,
    )


def _pack(plan: StepPlan, prev: PreviousTokens | None, mrope: bool, prompt_rows: PromptRows | None) -> _Packed:
    """The extend segments first, then one token per decoding request (with M-RoPE's positions
    when some request has its own); the rows to sample, then the prompt-logprob rows."""
    k = _Packed()
    for req, n in plan.extends:
        start = len(k.ids)
        k.ids.extend(req.tokens[req.kv_len : req.kv_len + n])
        k.pos.extend(range(req.kv_len, req.kv_len + n))
        if req.images:
            _images(k, req, start, n)
        if mrope:
            _extend_rope(k, req, n)
        k.ext_rows.append(req.row)
        k.ext_starts.append(start)
        k.ext_lens.append(n)
        k.ext_prefix.append(req.kv_len)
        if req.kv_len + n == len(req.tokens):
            k.sample_index.append(start + n - 1)
    k.num_extend = len(k.ids)
    for req in plan.decodes:
        k.sample_index.append(len(k.ids))
        j = _in_flight(req, prev)
        if j is not None:
            k.from_prev.append((len(k.ids), j))
        k.ids.append(req.tokens[-1] if j is None else 0)
        k.pos.append(req.kv_len)
        if mrope:
            _extend_rope(k, req, 1)
        k.dec_rows.append(req.row)
        k.dec_lens.append(req.kv_len + 1)
    if prompt_rows is not None:
        k.sample_index.extend(prompt_rows.index)
    return k


def _images(k: _Packed, req: Req, start: int, n: int) -> None:
    """The rows of the request's images that fall in this chunk, positions [kv_len, kv_len + n):
    a chunk may begin or end inside an image, and takes exactly its share of the rows. Their
    ids (pseudo-ids, below 0) become 0 for the embedding lookup the rows then replace."""
    lo, hi = req.kv_len, req.kv_len + n
    for span in req.images:
        a, b = max(lo, span.offset), min(hi, span.end)
        if a >= b:
            continue
        k.image_positions.extend(range(start + a - lo, start + b - lo))
        k.image_rows.append(span.rows[a - span.offset : b - span.offset])
        for p in range(start + a - lo, start + b - lo):
            k.ids[p] = 0


def _extend_rope(k: _Packed, req: Req, n: int) -> None:
    """M-RoPE's three positions of the request's next n tokens (from its kv_len): its own where
    its prompt has images, else each stream the token's position."""
    rows = req.rope.rows(req.kv_len, n) if req.rope is not None else (range(req.kv_len, req.kv_len + n),) * 3
    for stream, r in zip(k.rope, rows, strict=True):
        stream.extend(r)


def _in_flight(req: Req, prev: PreviousTokens | None) -> int | None:
    """The row of prev.tokens that holds the request's input token, if that is still in flight."""
    if req.tokens[-1] != PLACEHOLDER:
        return None
    if prev is None or id(req) not in prev.index:
        raise RuntimeError(f"request {req.rid}: input token in flight but no previous step holds it")
    return prev.index[id(req)]


def _staged(
    plan: StepPlan, req_table: torch.Tensor, staging: DecodeInputs, prev: PreviousTokens | None
) -> ForwardBatch:
    tokens, positions, rows, offsets = [], [], [], []
    for req in plan.decodes:
        j = _in_flight(req, prev)
        tokens.append(req.tokens[-1] if j is None else -1 - j)
        positions.append(req.kv_len)
        rows.append(req.row)
        # a generated token's three M-RoPE positions are all its position plus the request's delta
        offsets.append(req.rope.delta if req.rope is not None else 0)
    assert plan.decode_slots is not None
    last = prev.tokens if prev else None
    return staging.build(tokens, positions, rows, plan.decode_slots, req_table, last, offsets)
