"""decode_inputs (a decode step's six inputs from one packed array) against its PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.pack_decode_inputs import OUTPUTS, decode_inputs, decode_inputs_reference

DUMMY_SLOT, DUMMY_ROW = 999, 77


def _outputs(width: int, device: torch.device) -> list[torch.Tensor]:
    # stale values everywhere: every lane must be written
    return [torch.full((width,), -5, dtype=dtype, device=device) for dtype in OUTPUTS.values()]


CONTEXT = 4000  # the request table's width, past every position a case draws


def _table(n: int, device: torch.device) -> torch.Tensor:
    # a table with every entry stale: only (row, position) of each request may change
    return torch.full((max(n, 1) * 3 + 1, CONTEXT), -7, dtype=torch.int32, device=device)


def _case(n: int, prev_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(n * 31 + prev_len)
    tokens = torch.randint(0, 50_000, (n,), generator=g)
    if prev_len:
        pending = torch.rand(n, generator=g) < 0.5
        tokens = torch.where(pending, -1 - torch.randint(0, prev_len, (n,), generator=g), tokens)
    positions = torch.randint(0, CONTEXT, (n,), generator=g)
    rows = torch.randperm(max(n, 1) * 3, generator=g)[:n]
    offsets = torch.where(torch.rand(n, generator=g) < 0.5, -torch.randint(0, 500, (n,), generator=g), 0)
    pack = torch.stack([tokens, positions, rows, torch.minimum(offsets, positions)]).to(device)
    prev = torch.randint(0, 128_000, (prev_len,), generator=g).to(device) if prev_len else None
    slots = torch.randperm(10_000, generator=g)[:n].to(torch.int32).to(device)
    return pack, prev, slots


@pytest.mark.parametrize(
    ("n", "width", "prev_len"), [(1, 1, 0), (1, 1, 1), (3, 8, 5), (8, 8, 8), (5, 700, 9), (600, 1100, 600), (0, 4, 0)]
)
def test_decode_inputs_is_the_reference(n: int, width: int, prev_len: int, device: torch.device) -> None:
    pack, prev, slots = _case(n, prev_len, device)
    got, want = _outputs(width, device), _outputs(width, device)
    got_table, want_table = _table(n, device), _table(n, device)
    decode_inputs(pack, prev, slots, got_table, got, DUMMY_SLOT, DUMMY_ROW)
    decode_inputs_reference(pack, prev, slots, want_table, want, DUMMY_SLOT, DUMMY_ROW)
    for name, g, w in zip(OUTPUTS, got, want, strict=True):
        assert torch.equal(g, w), name
    assert torch.equal(got_table, want_table)
    assert int((got_table != -7).sum()) == n


def test_what_the_lanes_hold(device: torch.device) -> None:
    # the second token is prev[1]; the third turns by M-RoPE's delta -3
    pack = torch.tensor([[11, -2, 13], [4, 5, 6], [0, 1, 2], [0, 0, -3]], device=device)
    prev = torch.tensor([100, 200], device=device)
    slots = torch.tensor([40, 41, 42], dtype=torch.int32, device=device)
    out = _outputs(5, device)
    table = torch.zeros(3, 8, dtype=torch.int32, device=device)
    decode_inputs(pack, prev, slots, table, out, DUMMY_SLOT, DUMMY_ROW)
    ids, positions, out_slots, rows, seq_lens, rotary_positions = (t.tolist() for t in out)
    assert ids == [11, 200, 13, 0, 0]
    assert positions == [4, 5, 6, 0, 0]
    assert out_slots == [40, 41, 42, DUMMY_SLOT, DUMMY_SLOT]
    assert rows == [0, 1, 2, DUMMY_ROW, DUMMY_ROW]
    assert seq_lens == [5, 6, 7, 1, 1]
    assert rotary_positions == [4, 5, 3, 0, 0]
    # each request's new slot is recorded at its row and position; the padding lanes write nothing
    want = torch.zeros(3, 8, dtype=torch.int32)
    want[0, 4], want[1, 5], want[2, 6] = 40, 41, 42
    assert torch.equal(table.cpu(), want)


def test_decode_inputs_rejects_what_it_cannot_write(device: torch.device) -> None:
    pack, prev, slots = _case(4, 2, device)
    table = _table(4, device)
    with pytest.raises(ValueError, match="pack"):
        decode_inputs(pack[:2], prev, slots, table, _outputs(4, device), DUMMY_SLOT, DUMMY_ROW)
    with pytest.raises(ValueError, match="slots"):
        decode_inputs(pack, prev, slots.long(), table, _outputs(4, device), DUMMY_SLOT, DUMMY_ROW)
    with pytest.raises(ValueError, match="do not fit"):
        decode_inputs(pack, prev, slots, table, _outputs(3, device), DUMMY_SLOT, DUMMY_ROW)
    with pytest.raises(ValueError, match="table"):
        decode_inputs(pack, prev, slots, table.long(), _outputs(4, device), DUMMY_SLOT, DUMMY_ROW)
    wrong = _outputs(4, device)
    wrong[3] = wrong[3].long()
    with pytest.raises(ValueError, match="rows"):
        decode_inputs(pack, prev, slots, table, wrong, DUMMY_SLOT, DUMMY_ROW)
    with pytest.raises(ValueError, match="6 tensors"):
        decode_inputs(pack, prev, slots, table, _outputs(4, device)[:5], DUMMY_SLOT, DUMMY_ROW)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_inputs_at_the_largest_decode_graph() -> None:
    cuda = torch.device("cuda")
    for n in (1, 64, 255, 512):
        pack, prev, slots = _case(n, n, cuda)
        got, want = _outputs(512, cuda), _outputs(512, cuda)
        got_table, want_table = _table(n, cuda), _table(n, cuda)
        decode_inputs(pack, prev, slots, got_table, got, DUMMY_SLOT, DUMMY_ROW)
        decode_inputs_reference(pack, prev, slots, want_table, want, DUMMY_SLOT, DUMMY_ROW)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        assert torch.equal(got_table, want_table)
