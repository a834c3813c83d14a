"""The router's policy against simulated worker groups on a fake clock (simulation.py).

Mixed ShareGPT-shaped workloads (half ignore_eos, the rest ending at EOS well before
their max_new_tokens) arriving faster than the groups can serve them. Measured KV usage
while requests wait in the router's queue, after a 3 s warm-up, two groups (mean / 10th
percentile of the rounds):

    pool per group   default (ratio 0.0)   ratio 0.9, guess 64
     3,000 tokens      0.87 / 0.80           0.89 / 0.81
     6,000 tokens      0.92 / 0.87           0.94 / 0.90
    12,000 tokens      0.96 / 0.94           0.96 / 0.94

LightLLM's estimate is tight when a pool holds tens of requests: its peak term over all
running requests is the tokens held now plus the shortest remaining output times the
batch, and that shortest remaining is small in a large batch. In a pool of only a few
requests (3,000 tokens here, about seven) the head of the queue often needs more than
one request's worth of room, and neither setting reaches 90%. So the 90% acceptance
check runs the default settings with 12,000-token pools, and guessed output lengths
(router_token_ratio 0.9, router_max_new_token_len 64, where the worker pauses requests
the guesses let in) with 6,000-token pools.
"""

from __future__ import annotations

from services.router.core import RouterCore
from shared.config import RouterConfig
from shared.messages import FINISH_ABORT, FINISH_ERROR, FINISH_LENGTH, FINISH_STOP
from tests.router.sim_worker import SimModel, SimWorker
from tests.router.simulation import T0_UNIX, Simulation, make_req, mixed_workload

MODEL = SimModel(eos_one_in=64)


def _cfg(**kw) -> RouterConfig:
    return RouterConfig(replica="sim", **kw)


def _sim(cfg: RouterConfig, capacity: int, groups: int = 2, model: SimModel = MODEL, **worker_kw) -> Simulation:
    return Simulation(cfg, [SimWorker(str(g), capacity, model, **worker_kw) for g in range(groups)])


def _assert_exact(sim: Simulation, rids: set[str] | None = None) -> None:
    for rid in rids if rids is not None else sim.outcomes:
        out = sim.outcomes[rid]
        assert out.finish_reason in (FINISH_STOP, FINISH_LENGTH), (rid, out.finish_reason, out.error_kind)
        assert out.tokens == sim.model.reference(sim.reqs[rid]), rid


def _overload(sim: Simulation, n: int, rate_per_s: float, seed: int = 1) -> float:
    """Submit a mixed workload; -> when its last request arrives."""
    reqs = mixed_workload(n, seed, rate_per_s)
    for r in reqs:
        sim.submit(r)
    return max(r.arrival for r in reqs) - T0_UNIX


def test_default_settings_keep_large_pools_above_90_percent_without_overflow() -> None:
    sim = _sim(_cfg(), capacity=12_000)
    last = _overload(sim, n=800, rate_per_s=60.0)
    sim.run_until_done()
    mean, p10 = sim.usage_under_load(3.0, last)
    print(f"default settings, 2 x 12000 tokens: usage under load mean {mean:.3f}, p10 {p10:.3f}")
    assert mean > 0.90 and p10 > 0.85, (mean, p10)
    assert all(w.peak_used <= w.capacity for w in sim.workers.values())
    # the estimate is an upper bound while requests start when admitted: pauses stay rare
    assert sim.pauses() <= len(sim.reqs) // 100
    _assert_exact(sim)


def test_guessed_lengths_keep_smaller_pools_full_and_preempted_requests_keep_their_output() -> None:
    sim = _sim(_cfg(router_token_ratio=0.9, router_max_new_token_len=64), capacity=6_000)
    last = _overload(sim, n=800, rate_per_s=30.0)
    sim.run_until_done()
    mean, p10 = sim.usage_under_load(3.0, last)
    print(f"ratio 0.9, guess 64, 2 x 6000 tokens: usage under load mean {mean:.3f}, p10 {p10:.3f}")
    assert mean > 0.92 and p10 > 0.85, (mean, p10)
    assert all(w.peak_used <= w.capacity for w in sim.workers.values())
    paused = sim.paused_rids()
    assert len(paused) >= 10, "the guesses never let in more than the pools hold: preemption went untested"
    _assert_exact(sim, paused)
    _assert_exact(sim)


def test_the_default_estimate_admits_no_more_than_a_pool_can_hold_when_all_run_to_the_end() -> None:
    """ignore_eos everywhere: every request runs to max_new_tokens, so the estimate is exact
    and any shortfall would show as a pause. Exact but for one thing: a request starts a step or
    two after it is placed, while the others go on growing, so a placement that brings the peak
    to the pool's last few tokens can come short by a few. Placed first in, first out this
    workload never meets that edge; cache_aware's lanes place in another order, and one of its
    60 requests does (over 30 variants of these lengths: 5 pauses first in, first out, 3 in
    lanes)."""
    for policy, pauses in (("least_loaded", 0), ("cache_aware", 1)):
        sim = _sim(_cfg(routing_policy=policy), capacity=4_000)
        for i in range(60):
            sim.submit(make_req(f"e{i}", 50 + 37 * i % 300, 40 + 53 * i % 400, ignore_eos=True, arrival_s=0.05 * i))
        sim.run_until_done()
        assert sim.pauses() <= pauses, policy
        _assert_exact(sim)


def test_aborts_free_the_tokens_wherever_the_request_is() -> None:
    # one group whose prefill budget a long prompt keeps busy for several steps, so a
    # request admitted behind it waits in the worker without having started
    sim = _sim(_cfg(), capacity=3_000, groups=1, prefill_budget=128)
    w = sim.workers["0"]
    sim.submit(make_req("running", 20, 900, ignore_eos=True))
    sim.submit(make_req("long-prompt", 1000, 10, ignore_eos=True, arrival_s=1.0))
    sim.submit(make_req("not-started", 10, 10, ignore_eos=True, arrival_s=1.0))
    # it fits the pool alone, but not beside "running": both would be growing when that one ends
    sim.submit(make_req("queued", 1_500, 1_400, ignore_eos=True, arrival_s=1.0))
    sim.submit(make_req("bystander", 30, 20, ignore_eos=False, arrival_s=1.0))
    sim.run_until(1.06)
    assert w.holds("not-started") and w.held_tokens("not-started") == 0
    assert 0 < w.held_tokens("long-prompt") < 1000, "the long prompt should be part-way through its prefill"
    assert "queued" in sim.core.waiting
    for rid in ("not-started", "long-prompt", "queued", "running"):
        sim.abort_at(sim.t + sim.step_s, rid)
        sim.round()  # the abort reaches the router, which forwards it; the worker takes it before its step
        assert not w.holds(rid) and rid not in sim.core.waiting, rid
        assert sim.outcomes[rid].finish_reason == FINISH_ABORT, rid
        # what the pool holds is exactly what the remaining requests hold: the aborted one's tokens are free
        assert w.used == sum(len(r.kv) for r in [*w.running, *w.waiting])
    sim.run_until_done()
    assert "queued" not in w.rids_seen  # never admitted
    assert w.used == 0
    _assert_exact(sim, {"bystander"})


def test_an_aborted_paused_request_is_dropped_and_the_rest_finish() -> None:
    # never busy, and a guess of 8 output tokens for requests that (with this model) never end early
    cfg = _cfg(router_token_ratio=1.0, router_max_new_token_len=8)
    sim = _sim(cfg, capacity=1_000, groups=1, model=SimModel(eos_one_in=1 << 40))
    for i in range(6):
        sim.submit(make_req(f"p{i}", 40, 300, ignore_eos=False, arrival_s=0.01 * i))
    w = sim.workers["0"]
    while not w.paused_rids:
        sim.round()
        assert sim.t < 30, "the guesses never over-filled the pool"
    victim = next(r.rid for r in w.waiting if r.rid in w.paused_rids)
    sim.abort_at(sim.t + sim.step_s, victim)
    sim.round()
    assert not w.holds(victim) and sim.outcomes[victim].finish_reason == FINISH_ABORT
    sim.run_until_done()
    assert w.used == 0
    _assert_exact(sim, set(sim.reqs) - {victim})


def test_deadlines_end_requests_in_the_queue() -> None:
    sim = _sim(_cfg(max_queue_time_s=2.0), capacity=2_000, groups=1)
    sim.submit(make_req("hog", 10, 1_900, ignore_eos=True))
    # each fits the pool alone but not beside "hog", which would still be growing
    sim.submit(make_req("late-queued", 10, 1_950, ignore_eos=True, arrival_s=0.5, deadline_s=1.0))
    sim.submit(make_req("queue-timeout", 10, 1_950, ignore_eos=True, arrival_s=0.5))
    sim.run_until(0.98)
    assert not sim.outcomes["late-queued"].finish_reason
    sim.run_until(1.12)  # the router scans its queue for deadlines every 0.1 s
    assert sim.outcomes["late-queued"].error_kind == "deadline"
    sim.run_until(2.48)
    assert not sim.outcomes["queue-timeout"].finish_reason
    sim.run_until(2.62)
    assert sim.outcomes["queue-timeout"].finish_reason == FINISH_ERROR
    assert sim.outcomes["queue-timeout"].error_kind == "deadline"
    sim.run_until_done()
    assert sim.outcomes["hog"].finish_reason == FINISH_LENGTH
    assert sim.workers["0"].rids_seen == {"hog"}


def test_a_deadline_ends_a_running_request_and_frees_its_tokens() -> None:
    sim = _sim(_cfg(), capacity=2_000, groups=1)
    sim.submit(make_req("late-running", 10, 500, ignore_eos=True, deadline_s=1.0))
    sim.submit(make_req("bystander", 10, 100, ignore_eos=True))
    sim.run_until(0.98)
    assert sim.workers["0"].held_tokens("late-running") > 10
    sim.run_until(1.02)
    assert sim.outcomes["late-running"].finish_reason == FINISH_ERROR
    assert sim.outcomes["late-running"].error_kind == "deadline"
    assert not sim.workers["0"].holds("late-running")
    sim.run_until_done()
    _assert_exact(sim, {"bystander"})
    assert sim.workers["0"].used == 0


def test_a_dead_groups_requests_go_on_elsewhere_exactly_and_it_rejoins_when_restarted() -> None:
    cfg = _cfg(batch_max_tokens=0)
    sim = _sim(cfg, capacity=3_000, prefill_budget=128)
    _overload(sim, n=120, rate_per_s=20.0, seed=7)
    sim.run_until(2.0)
    dying = sim.workers["1"]
    started: set[str] = set()
    unstarted: set[str] = set()
    while not (started and unstarted):  # a moment when some of its requests have output and some none
        sim.round()
        assert sim.t < 10.0
        on_dying = {r.rid for r in [*dying.running, *dying.waiting]}
        started = {rid for rid in on_dying if sim.outcomes[rid].tokens}
        unstarted = on_dying - started
    sim.kill("1")
    killed_at = sim.t
    while "1" in sim.core.groups:
        # what the router has placed there: what the worker held, and what it placed there since
        # (until a group is declared dead, the router takes its silence for a pause)
        placed_there = set(sim.core.groups["1"].placed)
        sim.round()
    assert on_dying <= placed_there
    assert sim.t - killed_at <= cfg.worker_dead_after_s + 0.1  # well within the 5 s the issue allows
    restarted = sim.restart("1")
    sim.run_until(sim.t + 2.0)
    assert restarted.admitted > 0, "the restarted group was not given requests"
    sim.run_until_done()
    # handed over with the output their clients had, they went on as if nothing had happened
    _assert_exact(sim, set(sim.reqs))
    assert sim.core.stats.requeued == len(placed_there) and not sim.core.stats.failed
    assert all(w.used == 0 for w in sim.workers.values())


def test_a_restarted_router_rebuilds_its_state_from_the_statuses() -> None:
    sim = _sim(_cfg(), capacity=3_000)
    _overload(sim, n=150, rate_per_s=20.0, seed=3)
    sim.run_until(3.0)
    held = {rid for w in sim.workers.values() for rid in (r.rid for r in [*w.running, *w.waiting])}
    queued = [r.rid for r in sim.core.waiting]
    assert held and queued
    sim.restart_router()
    sim.abort_at(sim.t + 0.5, queued[-1])  # reaches the new router before the request is handed to it
    sim.run_until(sim.t + 1.0)
    core: RouterCore = sim.core
    assert set(core.groups) == {"0", "1"}
    still_held = {rid for w in sim.workers.values() for rid in (r.rid for r in [*w.running, *w.waiting])}
    assert set(core.where) == still_held  # learnt from the statuses alone
    sim.run_until_done()
    assert sim.outcomes[queued[-1]].finish_reason == FINISH_ABORT
    _assert_exact(sim, set(sim.reqs) - {queued[-1]})
    assert all(w.peak_used <= w.capacity for w in sim.workers.values())


def test_a_group_declared_dead_that_was_only_silent_comes_back_without_duplicates() -> None:
    cfg = _cfg()
    sim = _sim(cfg, capacity=3_000, prefill_budget=128)
    _overload(sim, n=120, rate_per_s=20.0, seed=5)
    sim.run_until(2.0)
    silent = sim.workers["1"]
    silent.frozen = True
    sim.run_until(sim.t + cfg.worker_dead_after_s + 0.2)
    assert "1" not in sim.core.groups
    assert sim.core.stats.requeued and not sim.core.stats.failed  # every request it held handed over
    silent.frozen = False  # it wakes and goes on with its copies: they are stopped, their items dropped
    sim.run_until_done()
    _assert_exact(sim, set(sim.reqs))
    sim.run_until(sim.t + 1.0)
    assert all(w.used == 0 and not w.has_work for w in sim.workers.values())
    assert "1" in sim.core.groups
