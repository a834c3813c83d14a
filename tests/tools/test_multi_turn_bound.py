"""tools/multi_turn_bound.py: the KV a multi_turn run must read and the ratio's ceiling, against
sums worked out by hand."""

from __future__ import annotations

import pytest

from tools import multi_turn_bound
from tools.workload import multi_turn


def test_decode_reads_count_each_output_tokens_context():
    # conversation 1: prompt 3, 2 outputs (reads 3, 4); then prompt 3+2+1 = 6, 3 outputs (6, 7, 8)
    # conversation 2: prompt 5, 4 outputs (5, 6, 7, 8)
    convs = [[([1, 2, 3], 2), ([4], 3)], [([1] * 5, 4)]]
    longest, kv, prompts = multi_turn_bound.decode_reads(convs)
    assert longest == 5
    assert kv == (3 + 4) + (6 + 7 + 8) + (5 + 6 + 7 + 8)
    assert prompts == 3 + 6 + 5


def _result(on_s: float, off_s: float, prompts: int, cached: int) -> dict:
    args = {"multi_turn_conversations": 3, "multi_turn_turns": 2, "multi_turn_max_context": 4096}
    runs = {
        "on": {"seconds": on_s, "prompt_tokens": prompts, "cached_prompt_tokens": cached},
        "off": {"seconds": off_s, "prompt_tokens": prompts, "cached_prompt_tokens": 0},
    }
    return {"args": args, "by_prompt_cache": {s: {"multi_turn": r} for s, r in runs.items()}}


def test_the_ceiling_adds_the_decode_floor_to_each_sides_prompt_tokens():
    longest, kv, prompts = multi_turn_bound.decode_reads(multi_turn(3, 2, 4096))
    cached = prompts // 2
    # 1 s more for the off run's extra prompt tokens: a token costs 1 / (prompts - computed_on) s
    out = multi_turn_bound.ceiling(
        _result(2.0, 3.0, prompts, cached), copy_gbps=1.0, weights_gb=1.0, kv_bytes_per_token=1
    )
    per_token = 1.0 / cached
    decode = longest * 1.0 + kv * 1e-9
    assert out["decode_floor_s"] == pytest.approx(decode)
    assert out["prompt_token_cost_us"] == pytest.approx(per_token * 1e6)
    on = decode + per_token * (prompts - cached)
    off = decode + per_token * prompts
    assert out["ratio_ceiling"] == pytest.approx(off / on)
    assert out["measured_ratio"] == pytest.approx(1.5)
    # a faster copy rate lowers the decode floor and lifts the ceiling
    faster = multi_turn_bound.ceiling(_result(2.0, 3.0, prompts, cached), 10.0, 1.0, 1)
    assert faster["ratio_ceiling"] > out["ratio_ceiling"]


def test_a_result_of_another_workload_is_refused():
    _, _, prompts = multi_turn_bound.decode_reads(multi_turn(3, 2, 4096))
    with pytest.raises(ValueError, match="not the workload's"):
        multi_turn_bound.ceiling(_result(2.0, 3.0, prompts + 1, 10), 1.0, 1.0, 1)
