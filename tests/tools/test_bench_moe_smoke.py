"""tools/bench_moe.py runs on the CPU at tiny shapes under the Triton interpreter (--cpu-smoke),
so the script behind the experts kernel's figures (bf16 and --fp8) cannot rot between GPU runs.
Its timings mean nothing here."""

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
        [sys.executable, script, "--cpu-smoke", "--fp8", "--out", str(out)],
        check=True,
        timeout=300,
        stdout=subprocess.DEVNULL,
    )
    report = json.loads(out.read_text())
    rows = [v for k, v in report.items() if k.startswith("T=")]
    assert len(rows) == 2 and all(r["ms"] > 0 and r["experts_hit"] >= 2 for r in rows)
    # FP8: a byte a weight and a float32 scale a row, against bf16's two bytes a weight
    h, inter = report["shape"]["hidden"], report["shape"]["inter"]
    for r in rows:
        fp8 = r["fp8"]
        assert fp8["ms"] > 0 and fp8["weight_bytes"] == r["experts_hit"] * (3 * h * inter + 4 * (2 * inter + h))
        assert fp8["bf16_weight_bytes"] == 2 * r["experts_hit"] * 3 * h * inter
