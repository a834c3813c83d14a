"""tools/kernel_quant_sweep.py without a GPU: its candidates are valid launches and stay within the
sweep's budget at Llama-3-8B's shapes (the FMA tiles at M <= 4 included), its table literal pastes
back, and the whole sweep runs at a tiny shape under the Triton interpreter (its timings mean
nothing), so the script behind gemm_tiles.py's tables cannot rot between GPU runs."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch

from services.worker.kernels.gemm_tiles import FMA_MAX_M, Tile
from tools import kernel_quant_sweep
from tools.quant_sweep_candidates import (
    DEFAULTS,
    GROUP,
    SMOKE,
    VARIANTS,
    X8_MIN_M,
    Space,
    first_round,
    next_round,
    valid,
)

SHAPES = kernel_quant_sweep.projections(smoke=False)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("m", [*Space().rows, 64, 256])
def test_candidates_are_valid_and_bounded(variant: str, shape: str, m: int) -> None:
    space = Space()
    k = SHAPES[shape][1]
    first = first_round(variant, k, m, space)
    assert first[0] == DEFAULTS[variant] and len(set(first)) == len(first)
    assert all(valid(variant, t, k, m) for t in first)
    # the FMA tiles join at 1 and 4 rows only
    assert any(not t.dot for t in first) == (m <= FMA_MAX_M)
    # the e4m3-activation tiles past one row, for FP8 only
    assert any(t.x8 for t in first) == (variant == "fp8" and m > X8_MIN_M)
    # the worst case: the later rounds vary the tiles least like the ones already timed
    split = next_round(1, variant, k, m, first[::-1], space)
    stages = next_round(2, variant, k, m, [*split, *first][::-1], space)
    assert {t.split for t in split} <= set(space.splits) and all(valid(variant, t, k, m) for t in split + stages)
    assert {t.num_stages for t in stages if not t.dot} <= set(space.fma_stages)
    bound = (95 if m <= FMA_MAX_M else 60) + (50 if variant == "fp8" and m > X8_MIN_M else 0)
    assert len(first) + len(split) + len(stages) <= bound
    if variant == "int4":
        assert all(GROUP % t.block_k == 0 for t in first + split + stages)


def test_valid_refuses() -> None:
    assert not valid("int4", Tile(64, 256, 4, 3), 4096, 1)  # a step across two groups
    assert not valid("fp8", Tile(128, 256, 2, 4), 4096, 1)  # 512 weight elements a thread
    assert not valid("fp8", Tile(16, 64, 8, 4), 4096, 1)  # 4 a thread: idle warps
    assert not valid("fp8", Tile(64, 128, 4, 4, split=2), 256, 1)  # shares of one step
    assert valid("fp8", Tile(64, 128, 4, 4, split=1), 256, 1)
    fma = Tile(32, 512, 4, 3, dot=False)  # 128 weight elements a thread
    assert valid("fp8", fma, 4096, 1)
    assert not valid("fp8", fma, 4096, 2)  # 256 products a thread
    assert not valid("fp8", Tile(8, 128, 1, 3, dot=False), 4096, 16)  # more rows than FMA_MAX_M
    assert not valid("fp8", Tile(64, 128, 4, 4, x8=True), 4096, X8_MIN_M)  # x8 past X8_MIN_M rows only
    assert valid("fp8", Tile(64, 128, 4, 4, x8=True), 4096, 64)
    assert not valid("int4", Tile(64, 128, 4, 4, x8=True), 4096, 64)


def test_table_literal() -> None:
    """The printed entries paste back as Tiles; the dot field only when it is False."""
    row = {"us": 1.0, "default_us": 2.0}
    fma, mma = Tile(16, 256, 4, 3, 8, dot=False), Tile(64, 128, 2, 3, None)
    rows = {"1": {**row, "best": asdict(fma)}, "16": {**row, "best": asdict(mma)}}
    report = {"variants": ["fp8"], "fp8": {"qkv": {"n": 6144, "k": 4096, "rows": rows}}}
    text = kernel_quant_sweep.table_literal(report)
    assert "(6144, 4096, 1): Tile(16, 256, 4, 3, 8, dot=False)," in text
    assert "(6144, 4096, 16): Tile(64, 128, 2, 3, None)," in text
    table = eval(text.split("= ", 1)[1], {"Tile": Tile})  # the literal as pasted
    assert table == {(6144, 4096, 1): fma, (6144, 4096, 16): mma}
    # past 16 rows an FP8 entry must beat torch._scaled_mm, not the default
    x8 = Tile(64, 128, 4, 3, 2, x8=True)
    rows["64"] = {"us": 1.0, "default_us": 9.0, "scaled_mm_us": 1.01, "best": asdict(x8)}
    rows["256"] = {"us": 1.0, "default_us": 9.0, "scaled_mm_us": 2.0, "best": asdict(x8)}
    text = kernel_quant_sweep.table_literal(report)
    assert "(6144, 4096, 256): Tile(64, 128, 4, 3, 2, x8=True),  # qkv: 1.0 us, _scaled_mm 2.0" in text
    assert "(6144, 4096, 64)" not in text


def test_cpu_smoke_x8(tmp_path) -> None:
    """Past 16 rows the FP8 sweep times x8 tiles too, and checks them against the reference on the
    quantized x (an x8 tile measured against the reference on x itself would fail)."""
    report = kernel_quant_sweep.main(["--cpu-smoke", "--variants", "fp8", "--rows", "32", "--out", str(tmp_path / "s")])
    row = report["fp8"]["qkv"]["rows"]["32"]
    assert row["failed"] == 0 and all(c["excess_err"] <= 0 for c in row["checked"])
    assert row["timed"] > len(first_round("fp8", 256, 32, SMOKE)) / 2  # the x8 half included
    space = replace(SMOKE, rows=(32,))
    bench = kernel_quant_sweep.Bench("fp8", 256, 256, torch.device("cpu"), torch.float16, space)
    assert bench.check(32, Tile(32, 128, 4, 2, x8=True)) <= 0


def test_cpu_smoke(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    report = kernel_quant_sweep.main(["--cpu-smoke", "--out", str(out)])
    assert json.loads(out.read_text())["table"] == report["table"]
    for variant in VARIANTS:
        row = report[variant]["qkv"]["rows"]["1"]
        assert row["best"] is not None and row["us"] > 0 and row["default_us"] > 0 and row["failed"] == 0
        assert all(c["excess_err"] <= 0 for c in row["checked"])
    assert report["table"].startswith("FP8_TILES: TileTable = {") and "INT4_TILES: TileTable = {" in report["table"]
