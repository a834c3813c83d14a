"""LightLLM's peak estimate and the router's admission decisions."""

from __future__ import annotations

from services.router.actions import Actions
from services.router.admission import Load, estimated_remaining, peak_tokens
from services.router.core import RouterCore
from services.router.group import SEQ_GAP
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


# ---------------------------------------------------------------- with the prompt cache

P = list(range(1000, 1400))  # a 400-token prefix


def _cache_status(
    capacity: int, free: int, evictable: int = 0, locked: int = 0, seq: int = 0, cache: bool = True
) -> WorkerStatus:
    table = RunningTable.of([])
    return WorkerStatus("0", "inst-0", capacity, free, 64, seq, table, 0.0, evictable, locked, prompt_cache=cache)


def _tokens_req(rid: str, tokens: list[int], max_new: int) -> GenerateReq:
    return GenerateReq(rid, "f", "d", tokens, SamplingParams(max_new_tokens=max_new, ignore_eos=True), 0.0, 0.0)


def _admit(core: RouterCore, *reqs: GenerateReq) -> list[str]:
    act = Actions()
    for r in reqs:
        core.on_generate(r, 0.0, act)
    core.tick(0.0, 0.0, act)
    core.seal_admissions(act)
    return [r.rid for rs in act.admits.values() for r in rs]


def test_a_pool_full_of_cache_still_admits() -> None:
    core = RouterCore(RouterConfig(router_token_ratio=0.5, router_max_new_token_len=40))
    core.on_status(_cache_status(1_000, free=0, evictable=1_000), 0.0, Actions())
    assert core.groups["0"].used_fraction == 0.0  # not busy: evictable tokens are free
    reqs = [
        GenerateReq(str(i), "f", "d", [i + 1] * 10, SamplingParams(max_new_tokens=500), 0.0, 0.0) for i in range(20)
    ]
    assert len(_admit(core, *reqs)) == 20  # each counted at 10 + 40 tokens


def test_requests_sharing_a_prefix_count_it_once() -> None:
    def admitted(cache_on: bool) -> list[str]:
        core = RouterCore(RouterConfig())
        status = _cache_status(1_000, free=1_000 - cache_on, evictable=int(cache_on), cache=cache_on)
        core.on_status(status, 0.0, Actions())
        a, b = _tokens_req("a", [*P, 1], 50), _tokens_req("b", [*P, 2], 50)
        c, d = _tokens_req("c", list(range(1, 301)), 50), _tokens_req("d", list(range(2, 302)), 50)
        return _admit(core, a, b, c, d)

    # a: 401 + 50; b shares a's 400 prefix: 1 + 50 more; c: 300 + 50: 852 tokens at the peak; d would pass 1000
    assert admitted(cache_on=True) == ["a", "b", "c"]
    assert admitted(cache_on=False) == ["a", "b"]  # two copies of the prefix: 902 already


def test_a_prefix_only_the_evictable_cache_holds_is_paid_by_the_request_that_reuses_it() -> None:
    core = RouterCore(RouterConfig())
    core.on_status(_cache_status(1_000, free=999, evictable=1), 0.0, Actions())
    assert _admit(core, _tokens_req("a", [*P, 1], 10)) == ["a"]
    # a ended; its prompt and output are cached, held by no one: free on demand
    core.on_status(_cache_status(1_000, free=589, evictable=411, seq=SEQ_GAP), 0.0, Actions())
    b = _tokens_req("b", [*P, 2], 300)
    c = _tokens_req("c", list(range(1, 301)), 10)
    # b reuses P and holds it again: 401 + 300 tokens at its end; beside c's 300 that is 1001
    assert _admit(core, b, c) == ["b"]
    g = core.groups["0"]
    assert g.placed["b"].cached == 400  # its prefill skips the prefix
    assert g.peak_with(None, 0, True, 1) == 401 + 300


def test_the_workers_locked_tokens_count_once_beside_each_requests_own() -> None:
    core = RouterCore(RouterConfig())
    core.on_status(_cache_status(1_000, free=999, evictable=1), 0.0, Actions())
    assert _admit(core, _tokens_req("a", [*P, 1], 100), _tokens_req("b", [*P, 2], 100)) == ["a", "b"]
    # both started, their prompts in the tree (402 tokens locked), 20 output tokens each
    running = [
        RunningReq("a", "d", 401, 421, 80, cached_tokens=401),
        RunningReq("b", "d", 401, 421, 80, cached_tokens=401),
    ]
    st = WorkerStatus("0", "inst-0", 1_000, 1_000 - 402 - 40, 64, SEQ_GAP, RunningTable.of(running), 0.0, 0, 402, True)
    core.on_status(st, 0.0, Actions())
    g = core.groups["0"]
    assert g.headroom() == 1_000 - 402 - 40
    assert g.peak_with(None, 0, True, 1) == 402 + 2 * (20 + 80)
