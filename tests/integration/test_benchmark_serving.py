"""The serving benchmark runs end to end against the tiny model on the CPU (a few requests),
so the script that produces docs/performance.md's serving figures cannot rot."""

from __future__ import annotations

import json
import os
import pathlib
import statistics

import pytest

from tests.integration.conftest import start_stack
from tools import bench_prompt_cache, bench_structured, benchmark_serving
from tools.redis_server import RedisServer

# a benchmark tool end to end on the tiny model: opt-in (pytest -m bench), to keep CI within its time
pytestmark = pytest.mark.bench


def _bench(url: str, out: pathlib.Path, *flags: str) -> list[dict]:
    """benchmark_serving's results for six requests over a 1000-token vocabulary, written to out."""
    args = ["--url", url, "--out", str(out), "--requests", "6", "--vocab", "1000", *flags, "--quiet"]
    return benchmark_serving.main(args)


def _assert_sound(r: dict) -> None:
    """One run's figures: every request done, and each latency's median at most its p99."""
    assert r["completed"] == 6 and r["failed"] == 0, r["errors"]
    assert r["req_per_s"] > 0 and r["output_tok_per_s"] > 0
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert 0 < r[metric]["median"] <= r[metric]["p99"], (metric, r[metric])
    assert r["e2e_ms"]["median"] >= r["ttft_ms"]["median"]


def test_benchmark_serving_on_the_tiny_model(long_context_model: str, redis_server: RedisServer, tmp_path) -> None:
    stack = start_stack(long_context_model, redis_server, str(tmp_path / "logs"))
    try:
        out = tmp_path / "bench.json"
        png = tmp_path / "latency.png"
        results = _bench(stack.url, out, "--rates", "inf,20", "--plot", str(png))
        # one at a time: each request on the connection the last one left
        one_by_one = _bench(stack.url, tmp_path / "one.json", "--max-concurrency", "1", "--per-request")
        # through aiohttp, as vLLM's client
        through_aiohttp = _bench(stack.url, tmp_path / "aiohttp.json", "--client", "aiohttp")
    finally:
        stack.stop()
    assert len(results) == 2 and len(one_by_one) == 1 and len(through_aiohttp) == 1
    assert results[0]["client"] == one_by_one[0]["client"] == "lean" and through_aiohttp[0]["client"] == "aiohttp"
    assert one_by_one[0]["connections_opened"] == 1 and results[0]["connections_opened"] == 6
    tokens = [r["output_tok_per_s"] * r["duration_s"] for r in (results[0], one_by_one[0], through_aiohttp[0])]
    assert tokens == pytest.approx([tokens[0]] * 3)  # the same output tokens, from the usage chunk, either client
    for r in [*results, *one_by_one, *through_aiohttp]:
        _assert_sound(r)
    assert json.loads(out.read_text())[0]["request_rate"] == "inf"
    each = one_by_one[0]["per_request_ttft_ms"]  # in the workload's order
    assert len(each) == 6 and all(t > 0 for t in each)
    assert statistics.median(each) == pytest.approx(one_by_one[0]["ttft_ms"]["median"])
    assert "per_request_ttft_ms" not in results[0]
    assert png.exists() and os.path.getsize(png) > 1000


def test_the_prompt_cache_variants_run_multi_turn_through_two_groups(long_context_model: str, tmp_path) -> None:
    """tools/bench_prompt_cache.py: a stack per variant (here the prompt cache on and off, under
    the router's own policy), two worker groups, conversations whose replies come back as ids."""
    flags = ["--model-dir", long_context_model, "--device", "cpu", "--vocab", "1000", "--fronts", "1"]
    flags += ["--policies", "default", "--prompt-cache", "on,off", "--groups", "2", "--gpus-per-group", "0"]
    small = ["--multi-turn-conversations", "3", "--multi-turn-turns", "3", "--multi-turn-max-context", "1200"]
    out = tmp_path / "out"
    res = bench_prompt_cache.main(
        ["--out-dir", str(out), "--work-dir", str(tmp_path / "work"), *flags, "--workload", "multi_turn", "--", *small]
    )
    assert set(res["runs"]) == {"default-on", "default-off"}
    for run in res["runs"].values():
        assert run["completed"] == run["turns"] > run["conversations"] and run["failed"] == 0, run["errors"]
        assert run["unknown_labels"] == 0 and run["ambiguous_tokens"] == 0
    assert res["ratios"]["on_over_off"]["default"]["req_per_s"] > 0
    assert json.loads((out / "prompt_cache.json").read_text())["ratios"] == res["ratios"]


def test_the_structured_output_benchmark_compares_like_with_like(long_context_model: str, tmp_path) -> None:
    """tools/bench_structured.py on the tiny model: every schema compiles once (the worker's log
    has each), and the unconstrained runs write exactly the constrained runs' output tokens."""
    flags = ["--model-dir", long_context_model, "--device", "cpu", "--vocab", "1000", "--requests", "6"]
    out = tmp_path / "out"
    res = bench_structured.main(
        [
            "--out-dir",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            *flags,
            "--low-load",
            "2",
            "--",
            "--max-output",
            "12",
        ]
    )
    assert len(res["cold_ttft_ms"]) == 10 and all(t and t > 0 for t in res["cold_ttft_ms"])
    assert len(res["compiles"]) == 10 and all(c["kind"] == "json_schema" and c["ms"] > 0 for c in res["compiles"])
    runs = res["runs"]
    for pair in (("low_json", "low_free"), ("json", "free")):
        a, b = (runs[k] for k in pair)
        assert a["failed"] == b["failed"] == 0, (a["errors"], b["errors"])
        assert a["output_tok_per_s"] * a["duration_s"] == pytest.approx(b["output_tok_per_s"] * b["duration_s"])
    assert runs["json"]["completed"] == 6 and runs["low_json"]["completed"] == 2
    assert res["json_over_free"]["workload"]["req_per_s"] > 0
    assert json.loads((out / "structured.json").read_text())["json_over_free"] == res["json_over_free"]
