"""Decode-only batches built in the decode graphs' input layout (decode_inputs.py): the same batch
as the general builder's, and the same outputs from the engine (the kernel runs under the
Triton interpreter on the CPU)."""

from __future__ import annotations

import pytest
import torch

from services.worker.batch_builder import PreviousTokens, build_batch
from services.worker.build import build_engine
from services.worker.kernels.pack_decode_inputs import OUTPUTS
from services.worker.request import PLACEHOLDER, Req
from services.worker.runtime.graph_inputs import DecodeInputs, DecodeInputViews
from services.worker.scheduler import StepPlan
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run

CPU = torch.device("cpu")


def test_the_layout_names_what_the_kernel_writes() -> None:
    assert DecodeInputViews._fields == tuple(OUTPUTS)
    staging = DecodeInputs(12, dummy_slot=99, dummy_row=7, device=CPU)
    views = staging.views(staging.static)
    assert [v.dtype for v in views] == list(OUTPUTS.values())
    assert all(v.shape == (12,) and v.data_ptr() % 16 == 0 for v in views)
    assert views.out_slots.tolist() == [99] * 12 and views.rows.tolist() == [7] * 12


def _decode_plan() -> tuple[StepPlan, PreviousTokens]:
    reqs = []
    for i, (tokens, kv_len) in enumerate([([5, 6, 7], 2), ([1, 2, PLACEHOLDER], 2), ([9, PLACEHOLDER], 1)]):
        r = Req(request(str(i), tokens[:1]), i)
        r.tokens, r.kv_len, r.row = list(tokens), kv_len, 3 * i + 1
        reqs.append(r)
    prev = PreviousTokens(torch.tensor([70, 80, 90]), {id(reqs[1]): 2, id(reqs[2]): 0})
    slots = torch.tensor([11, 12, 13], dtype=torch.int32)
    return StepPlan(decodes=reqs, decode_slots=slots), prev


def test_a_staged_batch_is_the_general_one() -> None:
    plan, prev = _decode_plan()
    table, staged_table = torch.zeros(10, 8, dtype=torch.int32), torch.zeros(10, 8, dtype=torch.int32)
    staging = DecodeInputs(8, dummy_slot=99, dummy_row=9, device=CPU)
    general = build_batch(plan, table, CPU, prev)
    staged = build_batch(plan, staged_table, CPU, prev, staging)
    # both record each decode's new slot at its row and position (kv_len), and nothing else
    recorded = torch.zeros(10, 8, dtype=torch.int32)
    recorded[1, 2], recorded[4, 2], recorded[7, 1] = 11, 12, 13
    assert torch.equal(table, recorded) and torch.equal(staged_table, recorded)
    assert staged.staged is not None and general.staged is None
    assert staged.input_ids.tolist() == general.input_ids.tolist() == [7, 90, 70]
    for name in ("positions", "out_slots", "decode_rows", "decode_seq_lens", "sample_index"):
        got, want = getattr(staged, name), getattr(general, name)
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), name
    assert staged.decode_max_len == general.decode_max_len
    assert staged.host == general.host
    assert staged.sample_rows is not None and staged.sample_rows.tolist() == [1, 4, 7]
    # no request here has M-RoPE positions: rotary turns each at its position
    assert staged.rotary_positions is not None and staged.rotary_positions.tolist() == [2, 2, 1]
    padding = staging.views(staged.staged)
    assert padding.out_slots[3:].tolist() == [99] * 5 and padding.seq_lens[3:].tolist() == [1] * 5
    assert padding.rotary_positions[3:].tolist() == [0] * 5
    # loading it into the graphs' inputs is one copy of the whole buffer
    assert staging.load(staged) and torch.equal(staging.static, staged.staged)
    assert not staging.load(general)


def test_a_position_past_the_table_is_refused() -> None:
    plan, prev = _decode_plan()
    with pytest.raises(ValueError, match="past the request table"):
        build_batch(plan, torch.zeros(10, 2, dtype=torch.int32), CPU, prev, DecodeInputs(8, 99, 9, CPU))


def test_batches_too_large_or_with_prompt_tokens_take_the_general_path() -> None:
    plan, prev = _decode_plan()
    table = torch.zeros(10, 8, dtype=torch.int32)
    assert build_batch(plan, table, CPU, prev, DecodeInputs(2, 99, 9, CPU)).staged is None
    r = Req(request("p", [3, 4]), 9)
    r.row = 0
    plan.extends.append((r, 2))
    plan.extend_slots.append(torch.tensor([20, 21], dtype=torch.int32))
    assert build_batch(plan, table, CPU, prev, DecodeInputs(8, 99, 9, CPU)).staged is None


def test_the_engine_gives_the_same_tokens_with_staged_batches(tiny_llama: str) -> None:
    tok = hf_reference.tokenizer(tiny_llama)
    prompts = ["The children ran along the beach", "Once upon a time", "A B C D", "Rain fell on the hills"]
    reqs = [
        request(f"g{i}", tok(p)["input_ids"], max_new_tokens=8 + 4 * i, ignore_eos=True) for i, p in enumerate(prompts)
    ]
    reqs += [
        request("s", tok("The sea")["input_ids"], max_new_tokens=15, do_sample=True, seed=3, ignore_eos=True),
        request(
            "p",
            tok("One two")["input_ids"],
            max_new_tokens=10,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            ignore_eos=True,
        ),
    ]
    cfg = WorkerConfig(model_dir=tiny_llama)
    plain = run(build_engine(cfg), reqs)
    engine = build_engine(cfg)
    # width 4: the steps of five or six decodes still take the general path
    staging = DecodeInputs(4, engine.runner.model.attn.cache.dummy_slot, engine.kv.table.dummy_row, CPU)
    built = []
    staging.build = lambda *a, _build=staging.build: built.append(_build(*a)) or built[-1]
    engine.runner.staging = staging
    staged = run(engine, reqs)
    assert len(built) >= 5 and any(b.host.sample_index == [0, 1, 2, 3] for b in built)
    assert {k: v.tokens for k, v in staged.items()} == {k: v.tokens for k, v in plain.items()}
    assert all(len(o.tokens) == r.params.max_new_tokens for r, o in zip(reqs, staged.values(), strict=True))
