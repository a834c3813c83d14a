"""tools/moe_offline_bound.py: the experts a step reads and the offline job's decode floor, against
sums worked out by hand."""

from __future__ import annotations

import pytest

from tools import moe_offline_bound as mb


def test_experts_read_two_of_eight_for_one_token_and_all_eight_in_the_limit():
    assert mb.experts_read(1, 8, 2) == pytest.approx(2.0)
    assert mb.experts_read(2, 8, 2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert mb.experts_read(200, 8, 2) == pytest.approx(8.0)


def test_mixtral_expert_is_its_three_matrices_in_bf16():
    sizes = mb.shape_bytes(mb.SHAPES["mixtral-8x7b"])
    assert sizes["expert"] == 3 * 4096 * 14336 * 2  # 352 MB
    assert (sizes["experts"], sizes["top_k"], sizes["layers"]) == (8, 2, 32)
    assert sizes["kv_token"] == 32 * 2 * 8 * 128 * 2


def test_decode_floor_follows_the_running_requests_step_by_step():
    sizes = {"expert": 100.0, "rest": 10.0, "kv_token": 1.0, "experts": 8, "top_k": 2, "layers": 2}
    # the prefill gives each its first token; decode step 1 runs all three (of more than 1 token:
    # 4.625 experts a layer; KV 10 + 1, 5 + 1, 7 + 1), step 2 the two 3-token ones (3.5; 12, 7)
    out = mb.decode_floor([(10, 3), (5, 3), (7, 2)], sizes, copy_gbps=1e-9)  # 1 byte/s
    weight = (2 * mb.experts_read(3, 8, 2) * 100 + 10) + (2 * 3.5 * 100 + 10)
    assert mb.experts_read(3, 8, 2) == pytest.approx(4.625)
    assert out["steps"] == 2
    assert out["decode_floor_s"] == pytest.approx(weight + 25 + 19)


def test_bound_divides_the_requests_by_floor_and_prefill():
    out = mb.bound("mixtral-8x7b", 16, copy_gbps=4297, prefill_s=1.0, peer_req_per_s=0.5)
    assert out["best_req_per_s"] == pytest.approx(16 / (out["decode_floor_s"] + 1.0))
    assert out["ratio_ceiling"] == pytest.approx(out["best_req_per_s"] / 0.5)
    assert 5.0 < out["decode_floor_s"] < 5.5  # the 16-request job: 5.2 s (docs/performance.md)
