"""tools/bench_moe.py runs on the CPU at tiny shapes under the Triton interpreter (--cpu-smoke),
so the script behind the experts kernel's figures cannot rot between GPU runs. Its timings mean
nothing here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_moe_smoke_reports_every_token_count(tmp_path) -> None:
    out = tmp_path / "moe.json"
    script = os.path.join(ROOT, "tools", "bench_moe.py")
    subprocess.run(
        [sys.executable, script, "--cpu-smoke", "--out", str(out)], check=True, timeout=300, stdout=subprocess.DEVNULL
    )
    report = json.loads(out.read_text())
    rows = [v for k, v in report.items() if k.startswith("T=")]
    assert len(rows) == 2 and all(r["ms"] > 0 and r["experts_hit"] >= 2 for r in rows)
