"""tools/inspect_report.py's report from a snapshot (the live stack's is tests/ops/test_inspect.py)."""

from __future__ import annotations

from tools.inspect_report import render


def test_each_group_shows_its_prompt_cache_and_each_request_its_cached_tokens() -> None:
    request = {"rid": "r1", "prompt_tokens": 300, "held_tokens": 310, "cached_tokens": 200, "remaining_tokens": 90}
    group = {
        "status_age_s": 0.2,
        "capacity_tokens": 1_000,
        "free_tokens": 100,
        "evictable_tokens": 500,
        "cache_locked_tokens": 300,
        "requests": [{**request, "paused": False}],
    }
    snap = {
        "time": 0.0,
        "namespace": "ls",
        "streams": [],
        "replicas": [],
        "in_flight": {"fronts": {}, "router_waiting": 0, "router_running": 1, "groups": {"0": group}},
    }
    text = render(snap)
    assert "group 0: 1 requests, KV 900/1000 tokens in use, prompt cache 800 of them (500 evictable)" in text
    header, row = (line.split() for line in text.splitlines()[-2:])
    assert header == ["group", "rid", "prompt", "held", "cached", "remaining", "paused"]
    assert row == ["0", "r1", "300", "310", "200", "90"]
