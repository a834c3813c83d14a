"""tools/soak.py: its growth measure and bounds on made-up series, and a one-minute soak of the
real stack (16 clients sending every kind of request of tools/soak_requests.py, two worker groups,
two front ends) within them: Redis's used_memory and
every process's RSS flat after the warm-up, every request completed, the KV pools all free."""

from __future__ import annotations

import pytest

from tools import soak, soak_requests


def test_growth_compares_the_last_window_with_the_one_after_the_warm_up() -> None:
    samples = [(float(t), 100 + t) for t in range(0, 100, 2)]  # one byte more every second
    g = soak.growth(samples, warmup_s=20, window_s=10, end_s=100)
    assert g["after_warmup"] == 124 and g["end"] == 194 and g["ratio"] == round(194 / 124, 4)
    assert g["first"] == 100 and g["max_after_warmup"] == 198
    exited = [*samples[:10], (20.0, None), *samples[11:]]
    assert soak.growth(exited, warmup_s=20, window_s=10, end_s=100)["ratio"] is None


def _report(ratio: float, lost: int = 0, all_free: bool = True) -> dict:
    g = {"after_warmup": 100, "end": round(100 * ratio), "ratio": ratio}
    return {
        "redis_used_memory": {**g, "ratio": 1.0},
        "rss": {"worker-0": g, "router": {**g, "ratio": 1.0}},
        "requests": {"completed": 10, "errors": 0, "lost": lost},
        "kv_at_end": {"groups": {}, "all_free": all_free},
    }


def test_flat_names_what_broke_the_bounds() -> None:
    assert soak.flat(_report(1.09)) == []
    (problem,) = soak.flat(_report(1.11))
    assert problem.startswith("rss worker-0: 100 -> 111")
    assert [p.split(":")[0] for p in soak.flat(_report(1.0, lost=1, all_free=False))] == [
        "requests",
        "KV not all free at the end",
    ]


def test_soak_options_must_hold_the_warm_up_and_two_windows() -> None:
    with pytest.raises(ValueError, match="too short"):
        soak.SoakOptions(minutes=1, warmup_s=30, window_s=20)


def test_soak_options_refuse_an_unknown_kind_of_request() -> None:
    with pytest.raises(ValueError, match="--mix"):
        soak.SoakOptions(mix=("generate", "chat"))
    with pytest.raises(ValueError, match="--mix"):
        soak.SoakOptions(mix=())


def test_counts_add_up_by_kind_of_request() -> None:
    counts = soak.Counts()
    counts.add("completed", request="schema")
    counts.add("errors", "schema: not JSON", request="schema")
    counts.add("lost", "regex: no answer", request="regex")
    assert (counts.completed, counts.errors, counts.lost) == (1, 1, 1)
    assert counts.by_kind == {
        "schema": {"completed": 1, "errors": 1, "lost": 0},
        "regex": {"completed": 0, "errors": 0, "lost": 1},
    }
    assert counts.error_samples == ["schema: not JSON", "regex: no answer"]


def test_a_cut_schema_answer_must_begin_one_the_schema_allows() -> None:
    assert soak_requests._answer_prefix('{"ok": fal')
    assert soak_requests._answer_prefix('{\n  "ok": true,\n  "size": "sm')
    assert soak_requests._answer_prefix("")
    assert not soak_requests._answer_prefix('{"ok": 1')
    assert not soak_requests._answer_prefix('{"size": "small"')  # the schema's order: ok first
    assert len(soak_requests.ANSWERS) == 4


@pytest.mark.bench  # a benchmark tool end to end, opt-in (CI keeps to 30 minutes)
def test_a_one_minute_soak_stays_flat(tmp_path) -> None:
    opts = soak.SoakOptions(
        minutes=1, clients=16, warmup_s=20, window_s=15, sample_s=2, log_dir=str(tmp_path), mix=soak_requests.KINDS
    )
    report = soak.soak(opts)
    req, kv = report["requests"], report["kv_at_end"]
    print(f"soak: {req}, redis {report['redis_used_memory']}, KV {kv}")
    for name, g in report["rss"].items():
        print(f"  rss {name}: {g['after_warmup']} -> {g['end']} (x{g['ratio']})")
    assert set(report["rss"]) == {
        "router",
        "worker-0",
        "worker-1",
        "detokenizer-0",
        "tokenizer",
        "tokenizer-1",
        "redis-server",
    }
    assert len(report["series"]["redis_used_memory"]) >= 25  # a sample every 2 s for a minute
    assert sorted(kv["groups"]) == ["0", "1"]
    assert soak.flat(report) == []
    assert sorted(req["by_kind"]) == sorted(soak_requests.KINDS)
