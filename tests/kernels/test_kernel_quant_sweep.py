"""tools/kernel_quant_sweep.py without a GPU: its candidates are valid launches and stay within the
sweep's budget at Llama-3-8B's shapes, and the whole sweep runs at a tiny shape under the Triton
interpreter (its timings mean nothing), so the script behind gemm_tiles.py's tables cannot rot
between GPU runs."""

from __future__ import annotations

import json

import pytest

from services.worker.kernels.gemm_tiles import Tile
from tools import kernel_quant_sweep
from tools.quant_sweep_candidates import DEFAULTS, GROUP, VARIANTS, Space, first_round, next_round, valid

SHAPES = kernel_quant_sweep.projections(smoke=False)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_candidates_are_valid_and_bounded(variant: str, shape: str) -> None:
    space = Space()
    k = SHAPES[shape][1]
    first = first_round(variant, k, space)
    assert first[0] == DEFAULTS[variant] and len(set(first)) == len(first)
    assert all(valid(variant, t, k) for t in first)
    # the worst case: the later rounds vary the tiles least like the ones already timed
    split = next_round(1, variant, k, first[::-1], space)
    stages = next_round(2, variant, k, [*split, *first][::-1], space)
    assert {t.split for t in split} <= set(space.splits) and all(valid(variant, t, k) for t in split + stages)
    assert len(first) + len(split) + len(stages) <= 60
    if variant == "int4":
        assert all(GROUP % t.block_k == 0 for t in first + split + stages)


def test_valid_refuses() -> None:
    assert not valid("int4", Tile(64, 256, 4, 3), 4096)  # a step across two groups
    assert not valid("fp8", Tile(128, 256, 2, 4), 4096)  # 512 weight elements a thread
    assert not valid("fp8", Tile(16, 64, 8, 4), 4096)  # 4 a thread: idle warps
    assert not valid("fp8", Tile(64, 128, 4, 4, split=2), 256)  # shares of one step
    assert valid("fp8", Tile(64, 128, 4, 4, split=1), 256)


def test_cpu_smoke(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    report = kernel_quant_sweep.main(["--cpu-smoke", "--out", str(out)])
    assert json.loads(out.read_text())["table"] == report["table"]
    for variant in VARIANTS:
        row = report[variant]["qkv"]["rows"]["1"]
        assert row["best"] is not None and row["us"] > 0 and row["default_us"] > 0 and row["failed"] == 0
        assert all(c["excess_err"] <= 0 for c in row["checked"])
    assert report["table"].startswith("FP8_TILES: TileTable = {") and "INT4_TILES: TileTable = {" in report["table"]
