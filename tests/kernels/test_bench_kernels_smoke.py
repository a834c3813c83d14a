"""tools/bench_kernels.py runs on the CPU at tiny shapes under the Triton interpreter (its
--cpu-smoke mode), split sweep and weight GEMMs included, so the script behind the kernel figures of
docs/performance.md cannot rot between GPU runs. Its timings mean nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# a benchmark tool end to end on the tiny model: opt-in (pytest -m bench), to keep CI within its time
pytestmark = pytest.mark.bench


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_kernels_smoke_reports_every_part(tmp_path) -> None:
    out = tmp_path / "kernels.json"
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tools", "bench_kernels.py"),
            "--cpu-smoke",
            "--split-sweep",
            "--parts",
            "ceilings,elementwise,decode,extend,quant_gemm",
            "--out",
            str(out),
        ],
        check=True,
        timeout=300,
        stdout=subprocess.DEVNULL,
    )
    report = json.loads(out.read_text())
    assert {"ceilings", "elementwise", "decode", "extend", "split_sweep", "quant_gemm"} <= set(report)
    gemm = report["quant_gemm"]
    assert set(gemm["layer"]) == {"bf16", "fp8_triton", "int4_awq"}  # no _scaled_mm off a GPU
    assert all(cell["ms"] > 0 and cell["floor_ms"] > 0 for cell in gemm["down"]["int4_awq"].values())
    rows = report["split_sweep"]["results"]
    assert rows and all(1 <= r["used_splits"] <= r["grid_splits"] and r["ms"] > 0 for r in rows)
    assert all(r["GB/s"] > 0 and r["graph_ms"] > 0 for r in report["decode"].values())
