"""tools/trace_lowload.py finds every hop of a lone request's first token on the tiny model,
so that it cannot rot between GPU runs."""

from __future__ import annotations

import json
import math

import pytest

from tools import trace_lowload

# a benchmark tool end to end on the tiny model: opt-in (pytest -m bench), to keep CI within its time
pytestmark = pytest.mark.bench


def test_trace_finds_every_hop(long_context_model: str, tmp_path) -> None:
    out = tmp_path / "trace.json"
    result = trace_lowload.main(
        ["--out", str(out), "--requests", "3", "--model-dir", long_context_model, "--work-dir", str(tmp_path)]
    )
    assert len(result["rows"]) == 3 and all(row["ttft"] > 0 for row in result["rows"])
    median = json.loads(out.read_text())["median_ms"]
    assert not any(math.isnan(median[h]) for h in trace_lowload.HOPS), result["rows"]
    assert median["router"] > 0 and median["worker_step"] > 0 and median["detok"] > 0, median
