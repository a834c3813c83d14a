"""bench_pipeline's paired low-load figure: each request against itself in the engine alone."""

from __future__ import annotations

import pytest

from tools.bench_pipeline import paired_added


def test_pairs_take_the_prompt_length_out_of_the_difference() -> None:
    # prefill time grows with the prompt; the pipeline adds 2 ms to each request
    engine = {"ttft_each_ms": [5.0, 9.0, 20.0, 7.0, 8.0]}
    pipeline = {"per_request_ttft_ms": [7.0, 11.0, 22.0, 9.0, 10.5]}
    assert paired_added(pipeline, engine) == pytest.approx(2.0)


def test_failed_requests_are_left_out_and_missing_figures_give_none() -> None:
    engine = {"ttft_each_ms": [5.0, 9.0, 20.0]}
    assert paired_added({"per_request_ttft_ms": [None, 12.0, 23.0]}, engine) == pytest.approx(3.0)
    assert paired_added({"ttft_ms": {"median": 1.0}}, engine) is None
    assert paired_added({"per_request_ttft_ms": [1.0]}, {}) is None
