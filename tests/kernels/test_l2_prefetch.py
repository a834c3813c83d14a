"""l2_prefetch: the pieces it asks for cover the range once (recorded, on the CPU too); on the
GPU its prefetches run eagerly and from a side stream inside a CUDA graph, changing nothing."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.l2_prefetch import CHUNK, LANES, l2_prefetch, prefetch_range
from services.worker.l2_ahead import L2Ahead, parse_plan


def _recorded(t: torch.Tensor, nbytes: int | None) -> torch.Tensor:
    """The (offset, size) pieces the kernel would ask for, as a [pieces, 2] int64 tensor."""
    _, n = prefetch_range(t, nbytes)
    lanes = -(-max(1, -(-n // CHUNK)) // LANES) * LANES
    rec = torch.full((2 * lanes,), -1, dtype=torch.int64, device=t.device)
    l2_prefetch(t, nbytes, record=rec)
    rec = rec.view(-1, 2).cpu()
    return rec[rec[:, 0] >= 0]


@pytest.mark.parametrize(
    ("numel", "offset", "nbytes"),
    [(12295, 0, None), (100, 0, 64), (300000, 0, 123457), (33, 0, None), (5000, 3, None), (70000, 1, 9000)],
)
def test_pieces_cover_the_range_once(numel: int, offset: int, nbytes: int | None, device: torch.device) -> None:
    t = torch.randn(numel + offset, dtype=torch.float16, device=device)[offset:]  # offset: a misaligned start
    start, n = prefetch_range(t, nbytes)
    total = t.numel() * t.element_size()
    assert (t.data_ptr() + start) % 16 == 0 and n % 16 == 0
    assert total - 30 <= start + n <= total if nbytes is None else min(nbytes, total) - 30 <= start + n <= nbytes
    pieces = _recorded(t, nbytes)
    assert (pieces[:, 1] > 0).all() and (pieces[:, 1] % 16 == 0).all() and (pieces[:, 1] <= CHUNK).all()
    covered = torch.zeros(total, dtype=torch.int32)
    for off, size in pieces.tolist():
        covered[off : off + size] += 1
    assert covered[start : start + n].eq(1).all() and covered.sum().item() == n


def test_nothing_to_ask_for_launches_nothing(device: torch.device) -> None:
    t = torch.randn(4, dtype=torch.float16, device=device)
    l2_prefetch(t, 0)  # no record, no CUDA: would raise if it launched on the CPU
    assert prefetch_range(t, 0) == (0, 0)


def test_a_bad_call_says_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        l2_prefetch(torch.randn(8, 8).t())
    with pytest.raises(ValueError, match="needs a CUDA tensor"):
        l2_prefetch(torch.randn(64))
    with pytest.raises(ValueError, match="record needs"):
        l2_prefetch(torch.randn(4 * CHUNK * LANES), record=torch.zeros(4, dtype=torch.int64))


def test_plans_parse_and_bad_ones_name_the_part() -> None:
    assert parse_plan("o=all, gate_up=16M,down=64K,qkv=4096") == {
        "o": None, "gate_up": 16 * 2**20, "down": 64 * 2**10, "qkv": 4096}  # fmt: skip
    assert parse_plan("") == {}
    for bad in ("o", "attn=all", "o=lots", "down=-5"):
        with pytest.raises(ValueError, match="l2 prefetch plan"):
            parse_plan(bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("line", [False, True])
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (128256, 4096), (7, 13)])
@pytest.mark.parametrize("nbytes", [None, 16 * 2**20, 1000])
def test_prefetches_run_and_change_nothing(shape: tuple[int, int], nbytes: int | None, line: bool) -> None:
    w = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    before = w.clone()
    l2_prefetch(w, nbytes, line=line)
    l2_prefetch(w[1:] if shape[0] > 1 else w, nbytes, line=line)  # a start 2 bytes off a 16-byte boundary
    torch.cuda.synchronize()
    assert torch.equal(w, before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_graph_with_prefetches_beside_its_products_computes_the_same() -> None:
    ws = [torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda") / 64 for _ in range(6)]
    x0 = torch.randn(2, 4096, dtype=torch.bfloat16, device="cuda")
    ahead = L2Ahead(parse_plan("o=all"), torch.device("cuda"))

    def chain(with_prefetch: bool) -> torch.Tensor:
        x = x0
        for i, w in enumerate(ws):
            x = x @ w.t()
            if with_prefetch and i + 1 < len(ws):
                ahead.ask("o", ws[i + 1])
        if with_prefetch:
            ahead.join()
        return x

    ref = chain(False)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain(True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = chain(True)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
