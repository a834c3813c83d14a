"""LightLLM's peak estimate and the router's admission decisions."""

from __future__ import annotations

from services.router.admission import Load, estimated_remaining, peak_tokens
from services.router.core import Actions, RouterCore
from shared.config import RouterConfig
from shared.messages import GenerateReq, RunningReq, RunningTable, SamplingParams, WorkerStatus


def brute_force_peak(loads: list[Load]) -> int:
    """Step time forward: each request grows one token per step until its remaining is used."""
    peak = 0
    for t in range(max((x.remaining for x in loads), default=0) + 1):
        peak = max(peak, sum(x.held + t for x in loads if t <= x.remaining))
    return peak


def test_peak_matches_a_simulation() -> None:
    import random

    rng = random.Random(0)
    for _ in range(300):
        loads = [Load(rng.randint(1, 50), rng.randint(0, 40)) for _ in range(rng.randint(0, 8))]
        assert peak_tokens(loads) == brute_force_peak(loads)


def test_estimated_remaining() -> None:
    assert estimated_remaining(1000, 10, full=True, guess_len=64) == 990
    assert estimated_remaining(1000, 10, full=False, guess_len=64) == 54
    assert estimated_remaining(1000, 100, full=False, guess_len=64) == 10  # 1.1x what it has produced
    assert estimated_remaining(20, 5, full=False, guess_len=64) == 15


def _req(rid: str, prompt: int, max_new: int) -> GenerateReq:
    return GenerateReq(rid, "f", "d", [1] * prompt, SamplingParams(max_new_tokens=max_new, ignore_eos=True), 0.0, 0.0)


def _status(group: str, capacity: int, running: list[RunningReq] | None = None, seq: int = 0) -> WorkerStatus:
    running = running or []
    used = sum(r.held_tokens for r in running)
    return WorkerStatus(group, "inst-" + group, capacity, capacity - used, 64, seq, RunningTable.of(running), 0.0)


def test_admits_while_the_peak_fits_then_waits() -> None:
    core = RouterCore(RouterConfig())
    act = Actions()
    core.on_status(_status("0", 100), 0.0, act)
    for i in range(4):
        core.on_generate(_req(str(i), 20, 20), 0.0, act)  # each may reach 40 tokens
    core.tick(0.0, 0.0, act)
    admitted = [r.rid for reqs in act.admits.values() for r in reqs]
    assert admitted == ["0", "1"]  # a third would need a peak of 120 > 100
    assert [r.rid for r in core.waiting] == ["2", "3"]


def test_a_request_larger_than_every_pool_is_rejected_not_queued() -> None:
    core = RouterCore(RouterConfig())
    act = Actions()
    core.on_status(_status("0", 100), 0.0, act)
    core.on_generate(_req("huge", 150, 10), 0.0, act)
    core.on_generate(_req("small", 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert [i.rid for items in act.ended.values() for i in items] == ["huge"]
    assert [r.rid for reqs in act.admits.values() for r in reqs] == ["small"]


def test_places_on_the_group_with_most_headroom() -> None:
    core = RouterCore(RouterConfig())
    act = Actions()
    core.on_status(_status("0", 1000, [RunningReq("old", "d", 400, 400, 100)]), 0.0, act)
    core.on_status(_status("1", 1000), 0.0, act)
    core.on_generate(_req("new", 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert list(act.admits) == [("1", "inst-1")]
