"""tools/bench_kernels.py runs on the CPU at tiny shapes under the Triton interpreter (its
--cpu-smoke mode), split sweep included, so the script behind the kernel figures of
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
            "--out",
            str(out),
        ],
        check=True,
        timeout=300,
        stdout=subprocess.DEVNULL,
    )
    report = json.loads(out.read_text())
    assert {"ceilings", "elementwise", "decode", "extend", "split_sweep"} <= set(report)
    rows = report["split_sweep"]["results"]
    assert rows and all(1 <= r["used_splits"] <= r["grid_splits"] and r["ms"] > 0 for r in rows)
    assert all(r["GB/s"] > 0 and r["graph_ms"] > 0 for r in report["decode"].values())
