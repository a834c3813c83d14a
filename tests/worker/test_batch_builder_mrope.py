"""The batch builder's M-RoPE positions (batch_builder.py): none for a step without a request
that has its own (every fast path stays), else three rows: a request's own (from its images'
grids) for its prompt chunk and its decodes (position + delta), each stream the position for the
others; the chunk's share of its image rows beside them."""

from __future__ import annotations

import torch

from services.worker.batch_builder import build_batch
from services.worker.request import Req
from services.worker.scheduler import StepPlan
from tests.worker.engine_driver import request
from tests.worker.mm_steps import image_req

IMG = 9


def _plan(extends: list[tuple[Req, int]], decodes: list[Req]) -> StepPlan:
    n = sum(k for _, k in extends)
    slots = [torch.arange(k, dtype=torch.int32) for _, k in extends]
    dec = torch.arange(n, n + len(decodes), dtype=torch.int32) if decodes else None
    return StepPlan(extends=extends, extend_slots=slots, decodes=decodes, decode_slots=dec)


def _req(rid: str, ids: list[int], row: int, kv_len: int = 0) -> Req:
    r = Req(request(rid, ids, max_new_tokens=4), row)
    return _at(r, row, kv_len)


def _at(r: Req, row: int, kv_len: int) -> Req:
    r.row, r.kv_len, r.alloc_len = row, kv_len, kv_len
    return r


def test_text_only_steps_have_no_rope_positions() -> None:
    a, b = _req("a", [1, 2, 3], 0), _req("b", [4, 5, 6, 7], 1, kv_len=3)
    batch = build_batch(_plan([(a, 3)], [b]), torch.zeros(4, 16, dtype=torch.int32), torch.device("cpu"))
    assert batch.rope_positions is None and batch.image_embeds is None


def test_rope_rows_of_a_chunk_a_decode_and_a_text_request() -> None:
    rows = torch.arange(8.0).view(4, 2)  # the image's four rows, H = 2
    image = _at(image_req("img", [1, IMG, IMG, IMG, IMG, 2, 3], IMG, rows, [(1, 2, 2)]), 0, 2)  # tokens 2..5
    decoding = _at(image_req("dec", [1, IMG, IMG, IMG, IMG, 2, 3, 50], IMG, rows, [(1, 2, 2)]), 1, 7)  # token 7
    text = _req("txt", [4, 5, 6], 2, kv_len=1)
    plan = _plan([(image, 4), (text, 2)], [decoding])
    batch = build_batch(plan, torch.zeros(4, 16, dtype=torch.int32), torch.device("cpu"))
    assert batch.rope_positions is not None
    assert batch.rope_positions.tolist() == [
        [1, 1, 1, 3, 1, 2, 5],  # image tokens 2..4 at t = 1, token 5 the text after; text 1, 2; decode 7 - 2
        [1, 2, 2, 3, 1, 2, 5],
        [2, 1, 2, 3, 1, 2, 5],
    ]
    assert batch.positions.tolist() == [2, 3, 4, 5, 1, 2, 7]  # the KV positions, unchanged
    assert batch.image_positions is not None and batch.image_embeds is not None
    assert batch.image_positions.tolist() == [0, 1, 2]  # the image's last three rows, in this chunk
    assert torch.equal(batch.image_embeds, rows[1:])
    assert batch.input_ids.tolist()[:4] == [0, 0, 0, 2]
