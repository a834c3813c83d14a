"""moe_align against the layout computed plainly: each expert's entries in one run, runs in
expert order padded to the block size with the no-entry value, each block's expert."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.moe_align import max_blocks, moe_align


def _routing(t: int, k: int, experts: int, device: torch.device, skew: bool = False) -> torch.Tensor:
    """[T, k] distinct experts per token; skew: most tokens on the same few experts."""
    scores = torch.rand(t, experts, device=device)
    if skew:
        scores[:, : min(k, experts)] += 1.0
    return scores.topk(k, dim=-1).indices


def _check(ids: torch.Tensor, experts: int, block_m: int) -> None:
    aligned = moe_align(ids, experts, block_m)
    n = ids.numel()
    blocks = max_blocks(n, experts, block_m)
    assert aligned.sorted_ids.shape == (blocks * block_m,) and aligned.block_expert.shape == (blocks,)
    sorted_ids, block_expert = aligned.sorted_ids.cpu(), aligned.block_expert.cpu()
    flat = ids.flatten().cpu()
    start = 0
    for e in range(experts):
        mine = torch.nonzero(flat == e).flatten()
        padded = -(-len(mine) // block_m) * block_m
        run = sorted_ids[start : start + padded]
        assert sorted(run[: len(mine)].tolist()) == mine.tolist(), f"expert {e}'s entries"
        assert (run[len(mine) :] == n).all(), f"expert {e}'s padding"
        assert (block_expert[start // block_m : (start + padded) // block_m] == e).all()
        start += padded
    assert (block_expert[start // block_m :] == -1).all()


@pytest.mark.parametrize(
    ("t", "k", "experts", "block_m"),
    [(1, 2, 8, 16), (7, 2, 5, 4), (33, 4, 16, 16), (5, 1, 3, 64), (16, 8, 8, 16), (300, 8, 128, 16)],
)
def test_entries_are_sorted_by_expert_into_padded_blocks(
    t: int, k: int, experts: int, block_m: int, device: torch.device
) -> None:
    _check(_routing(t, k, experts, device), experts, block_m)


def test_skewed_routing_and_int32_ids(device: torch.device) -> None:
    """Most entries on two experts (runs of many blocks, most experts empty); int32 ids."""
    ids = _routing(150, 2, 6, device, skew=True).to(torch.int32)
    _check(ids, 6, 16)


def test_more_entries_than_one_chunk(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counting and placing loops run over several chunks of entries alike."""
    from services.worker.kernels import moe_align as module

    monkeypatch.setattr(module, "CHUNK", 32)
    monkeypatch.setattr(module, "BLOCKS_BUDGET", 64)
    _check(_routing(45, 3, 8, device), 8, 4)


def test_the_sizes_hold_any_routing() -> None:
    assert max_blocks(2, 8, 16) == 2  # one token, top-2: two experts' blocks at most
    assert max_blocks(512, 8, 16) == 40  # 512 entries and up to 15 pads for each of 8 experts: 632 rows
    assert max_blocks(0, 8, 16) == 0


def test_bad_inputs_are_refused(device: torch.device) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        moe_align(torch.zeros(4, dtype=torch.int64, device=device), 4, 16)
    with pytest.raises(ValueError, match="power of two"):
        moe_align(torch.zeros(2, 2, dtype=torch.int64, device=device), 4, 12)
