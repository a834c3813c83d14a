"""The routing policies (services/router/routing.py), one decision at a time (no simulation).

Groups whose statuses report cache tokens have their prompt cache on; a request's prompt is
a shared prefix (P, a document or a system prompt) and a suffix of its own."""

from __future__ import annotations

import zlib

import pytest

from services.router.actions import Actions
from services.router.core import RouterCore
from services.router.group import SEQ_GAP
from shared.config import ConfigError, RouterConfig
from shared.messages import GenerateReq, RunningTable, SamplingParams, WorkerStatus

P = list(range(1000, 1100))  # a 100-token prefix


def _req(rid: str, tokens: list[int], max_new: int = 10) -> GenerateReq:
    return GenerateReq(rid, "f", "d", tokens, SamplingParams(max_new_tokens=max_new, ignore_eos=True), 0.0, 0.0)


def _prefixed(rid: str) -> GenerateReq:
    return _req(rid, [*P, zlib.crc32(rid.encode()) % 900 + 1])


def _status(
    group: str, capacity: int, cached: int = 10, instance: str = "", max_running: int = 64, seq: int = 0
) -> WorkerStatus:
    """An idle group; ``cached`` evictable tokens (0: its cache is off, or empty)."""
    table = RunningTable.of([])
    inst = instance or "inst-" + group
    return WorkerStatus(
        group,
        inst,
        capacity,
        capacity - cached,
        max_running,
        seq,
        table,
        0.0,
        evictable_tokens=cached,
        prompt_cache=True,
    )


def _core(**kw) -> RouterCore:
    return RouterCore(RouterConfig(replica="t", **kw))


def _place(core: RouterCore, *reqs: GenerateReq, now: float = 0.0) -> dict[str, str]:
    """Submit reqs and let the router place them; -> rid -> group."""
    act = Actions()
    for r in reqs:
        core.on_generate(r, 0.0, act)
    core.tick(now, 0.0, act)
    core.seal_admissions(act)
    return {r.rid: g for (g, _), rs in act.admits.items() for r in rs}


def _with_prefix_on_group_0(core: RouterCore, capacity_1: int = 8_000, cached: int = 10) -> None:
    """Group 0 (the smaller) runs a request with P before group 1 joins."""
    core.on_status(_status("0", 4_000, cached), 0.0, Actions())
    assert _place(core, _prefixed("seed")) == {"seed": "0"}
    core.on_status(_status("0", 4_000, cached, seq=SEQ_GAP), 0.0, Actions())  # it ended
    assert not core.groups["0"].placed
    core.on_status(_status("1", capacity_1, cached), 0.0, Actions())


def test_a_request_goes_to_the_group_that_has_its_prefix() -> None:
    core = _core()
    _with_prefix_on_group_0(core)
    # least_loaded would pick group 1 (twice the free tokens) for both
    assert _place(core, _prefixed("b"), _req("other", list(range(1, 60)))) == {"b": "0", "other": "1"}
    assert core.stats.routed == {("0", False): 1, ("0", True): 1, ("1", False): 1}


def test_a_request_waits_for_its_full_group_while_later_ones_for_others_go_on() -> None:
    core = _core()
    _with_prefix_on_group_0(core)
    # group 0's pool is full (by the router's count) once b0 is placed: b1 and b2 wait for it, in
    # order, rather than go to group 1 and compute P there; "other" (no prefix) goes on to group 1
    b0 = _req("b0", [*P, 1], max_new=3_890)
    assert _place(core, b0) == {"b0": "0"}
    later = [_req("b1", [*P, 2], max_new=3_000), _req("b2", [*P, 3], max_new=3_000), _req("other", list(range(1, 60)))]
    assert _place(core, *later) == {"other": "1"}
    assert [r.rid for r in core.waiting] == ["b1", "b2"]
    core.on_status(_status("0", 4_000, seq=SEQ_GAP + 1), 0.0, Actions())  # b0 ended
    assert _place(core) == {"b1": "0"}  # and b2 waits for b1, though group 1 has room


@pytest.mark.parametrize("max_overtake", [0, 1, 256])
def test_a_request_whose_prefix_runs_in_its_group_overtakes_the_lane_within_a_bound(max_overtake: int) -> None:
    """b0 runs with P on group 0 and leaves room for small requests only; b1 (P, long) waits in
    group 0's lane. Small requests with P would add only their own tokens to a pool that surely
    holds P: up to max_overtake of them start ahead of b1; the rest wait behind it."""
    core = _core(cache_aware_max_overtake=max_overtake)
    _with_prefix_on_group_0(core)
    assert _place(core, _req("b0", [*P, 1], max_new=3_700)) == {"b0": "0"}
    small = [_req(f"s{i}", [*P, 10 + i], max_new=50) for i in range(3)]
    placed = _place(core, _req("b1", [*P, 2], max_new=3_000), *small)
    overtakers = min(max_overtake, len(small))
    assert placed == {f"s{i}": "0" for i in range(overtakers)}
    assert [r.rid for r in core.waiting] == ["b1", *(f"s{i}" for i in range(overtakers, len(small)))]
    assert core.groups["0"].overtaken == overtakers
    # a request with no prefix in group 0 does not overtake there: it goes to group 1, which has room
    assert _place(core, _req("other", list(range(1, 60)))) == {"other": "1"}


def test_least_loaded_ignores_the_prefix() -> None:
    core = _core(routing_policy="least_loaded")
    _with_prefix_on_group_0(core)
    assert _place(core, _prefixed("b")) == {"b": "1"}


def test_past_the_balance_margin_the_request_goes_by_load() -> None:
    core = _core(cache_aware_balance_margin=1)
    _with_prefix_on_group_0(core, capacity_1=4_000)
    placed = _place(core, *(_prefixed(f"b{i}") for i in range(6)))
    # b0 and b1 follow P to group 0; b2 would make it 3 to 0, past the margin: it goes to
    # group 1, whose index then has P too, and the rest go by load
    assert [placed[f"b{i}"] for i in range(3)] == ["0", "0", "1"]
    assert sorted(placed.values()).count("0") == 3


@pytest.mark.parametrize(("rel", "on_prefix_group"), [(1.0, 4), (2.0, 5)])
def test_the_relative_margin_lets_a_busier_group_keep_its_prefix(rel: float, on_prefix_group: int) -> None:
    """Group 1 holds 2 requests. Past the absolute margin (1), a request with P still goes to group 0
    while group 0 holds no more than rel times group 1's: SGLang's two thresholds, both needed."""
    core = _core(cache_aware_balance_margin=1, cache_aware_balance_rel=rel)
    _with_prefix_on_group_0(core)
    assert _place(core, _req("o1", list(range(1, 60))), _req("o2", list(range(2, 61)))) == {"o1": "1", "o2": "1"}
    placed = _place(core, *(_prefixed(f"b{i}") for i in range(on_prefix_group + 1)))
    assert [placed[f"b{i}"] for i in range(on_prefix_group + 1)] == ["0"] * on_prefix_group + ["1"]


def test_a_short_common_prefix_does_not_attract() -> None:
    core = _core()
    _with_prefix_on_group_0(core)
    template = P[:10]  # a chat template's first tokens: a tenth of the prompt, under cache_aware_min_match
    assert _place(core, _req("t", template + list(range(1, 91)))) == {"t": "1"}


def test_without_cache_figures_the_index_is_not_used() -> None:
    core = _core()
    _with_prefix_on_group_0(core, cached=0)  # the groups' caches are off: what they report is 0
    assert _place(core, _prefixed("b")) == {"b": "1"}
    assert core.stats.routed == {("0", False): 1, ("1", False): 1}


def test_round_robin_alternates_over_the_groups_that_can_take_the_request() -> None:
    core = _core(routing_policy="round_robin")
    for g in ("a", "b", "c"):
        core.on_status(_status(g, 4_000, max_running=1 if g == "b" else 64), 0.0, Actions())
    placed = _place(core, *(_prefixed(f"r{i}") for i in range(6)))
    # b runs one request at a time: once it has one, the turn passes it by
    assert [placed[f"r{i}"] for i in range(6)] == ["a", "b", "c", "a", "c", "a"]


def test_a_restarted_group_loses_its_index() -> None:
    core = _core()
    _with_prefix_on_group_0(core)
    core.on_status(_status("0", 4_000, instance="new"), 1.0, Actions())  # a new instance: an empty cache
    assert core.groups["0"].index.size == 0
    assert _place(core, _prefixed("b"), now=1.0) == {"b": "1"}
    assert core.stats.routed[("1", False)] == 1


def test_a_group_declared_dead_comes_back_with_an_empty_index() -> None:
    core = _core()
    _with_prefix_on_group_0(core)
    core.on_status(_status("1", 8_000), 2.9, Actions())
    core.tick(3.5, 0.0, Actions())  # group 0 silent since 0.0: dead
    assert set(core.groups) == {"1"}
    core.on_status(_status("0", 4_000, seq=SEQ_GAP), 3.6, Actions())  # it was only silent: same instance
    assert core.groups["0"].index.size == 0
    assert _place(core, _prefixed("b"), now=3.6) == {"b": "1"}


def test_an_emptied_cache_empties_the_index() -> None:
    core = _core()
    _with_prefix_on_group_0(core)
    g = core.groups["0"]
    assert g.index.size > 0  # "seed" ended; its prompt stays in the index
    core.on_status(_status("0", 4_000, cached=0, seq=SEQ_GAP), 1.0, Actions())  # nothing cached, nothing running
    assert g.index.size == 0


def test_an_unknown_policy_or_a_bad_knob_is_refused_at_start() -> None:
    bad_knobs = (
        {"cache_aware_balance_margin": -1},
        {"cache_aware_balance_rel": 0.5},
        {"cache_aware_min_match": 1.5},
        {"cache_aware_max_overtake": -1},
    )
    for bad in ({"routing_policy": "random"}, *bad_knobs):
        with pytest.raises(ConfigError):
            RouterConfig(**bad)
