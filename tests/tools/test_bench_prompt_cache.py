"""tools/bench_prompt_cache.py's ratios between its variants (tests/integration/test_benchmark_serving.py
runs it on stacks of the tiny model)."""

from __future__ import annotations

from tools import bench_prompt_cache


def test_ratios_between_variants() -> None:
    runs = {
        "cache_aware-on": {"req_per_s": 6.0, "output_tok_per_s": 60.0},
        "cache_aware-off": {"req_per_s": 2.0, "output_tok_per_s": 20.0},
        "round_robin-on": {"req_per_s": 3.0, "output_tok_per_s": 30.0},
        "round_robin-off": {"req_per_s": 2.0, "output_tok_per_s": 20.0},
    }
    r = bench_prompt_cache.ratios(runs, ["cache_aware", "round_robin"], ["on", "off"])
    assert r["cache_aware_over_round_robin"]["on"] == {"req_per_s": 2.0, "output_tok_per_s": 2.0}
    assert r["on_over_off"]["round_robin"] == {"req_per_s": 1.5, "output_tok_per_s": 1.5}
    assert bench_prompt_cache.ratios(runs, ["cache_aware"], ["on"]) == {}
