"""The engine benchmarks run on the CPU against the tiny model (a few requests), so the
scripts behind docs/performance.md's engine, tensor-parallel and data-parallel figures
cannot rot: one rank, a TP=2 group (gloo), and two data-parallel groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# a benchmark tool end to end on the tiny model: opt-in (pytest -m bench), to keep CI within its time
pytestmark = pytest.mark.bench


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUESTS = 12


def _tool(name: str, *args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", name), *args],
        check=True,
        timeout=300,
        env=env,
        stdout=subprocess.DEVNULL,
    )


def _engine(model: str, out: str, *extra: str) -> dict:
    _tool(
        "benchmark_engine.py",
        "--out",
        out,
        "--model-dir",
        model,
        "--device",
        "cpu",
        "--requests",
        str(REQUESTS),
        *extra,
    )
    with open(out) as f:
        return json.load(f)


def test_one_rank_and_a_tp2_group_run_the_same_workload(long_context_model: str, tmp_path) -> None:
    one = _engine(
        long_context_model,
        str(tmp_path / "tp1.json"),
        "--parts",
        "offline,lowload,static",
        "--static",
        "2x64",
        "--static-steps",
        "4",
        "--low-load-requests",
        "2",
    )
    two = _engine(long_context_model, str(tmp_path / "tp2.json"), "--parts", "offline", "--tp", "2")
    off = one["offline"]
    assert off["requests"] == REQUESTS and off["req_per_s"] > 0
    assert off["output_tokens"] == REQUESTS * off["mean_output"] > 0
    assert one["static"][0]["batch"] == 2 and one["static"][0]["ms_per_step"] > 0
    assert one["low_load"]["ttft_ms"]["median"] > 0
    each = one["low_load"]["ttft_each_ms"]  # per request, in the workload's order, for the pairing
    assert len(each) == 2 and all(t > 0 for t in each)
    # the same requests, steps and tokens whichever way the model is split
    assert (two["offline"]["output_tokens"], two["offline"]["steps"]) == (off["output_tokens"], off["steps"])


def test_two_data_parallel_groups_share_the_workload_and_start_together(long_context_model: str, tmp_path) -> None:
    out = tmp_path / "dp.json"
    _tool(
        "bench_data_parallel.py",
        "--groups",
        "2",
        "--device",
        "cpu",
        "--requests",
        str(REQUESTS),
        "--out",
        str(out),
        "--",
        "--model-dir",
        long_context_model,
    )
    res = json.loads(out.read_text())
    assert res["requests"] == REQUESTS
    assert [g["requests"] for g in res["per_group"]] == [REQUESTS // 2] * 2
    assert res["start_skew_s"] < 1.0
    assert res["req_per_s"] == pytest.approx(REQUESTS / res["seconds"])
