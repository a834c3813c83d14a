"""The router's policies against simulated worker groups with a prompt cache (sim_pool.py).

Shared-prefix workloads: a few prefixes (system prompts, documents), each followed by a
suffix of its own. Measured here, 8 prefixes of 200 tokens x 8 requests with 40-token
suffixes, arriving at 20 a second, two groups of 4,000 tokens (a prompt is found in the
cache at most 7 times in 8, so the best possible is 7/8 x 200/240 = 0.729):

    one group   cache_aware   least_loaded   round_robin
      0.729        0.729         0.625          0.625
"""

from __future__ import annotations

import random

from shared.config import RouterConfig
from shared.messages import FINISH_LENGTH, FINISH_STOP, GenerateReq, SamplingParams
from tests.router.sim_worker import SimModel, SimWorker
from tests.router.simulation import T0_UNIX, Simulation, shared_prefix_workload

MODEL = SimModel(eos_one_in=64)


def _sim(groups: int = 2, capacity: int = 4_000, **cfg) -> Simulation:
    workers = [SimWorker(str(g), capacity, MODEL, prompt_cache=True) for g in range(groups)]
    return Simulation(RouterConfig(replica="sim", **cfg), workers)


def _run(sim: Simulation, reqs: list[GenerateReq]) -> Simulation:
    for r in reqs:
        sim.submit(r)
    sim.run_until_done()
    return sim


def _hit_rate(sim: Simulation) -> float:
    pools = [w.pool for w in sim.workers.values()]
    return sum(p.hit_tokens for p in pools) / sum(p.prompt_tokens for p in pools)


def _assert_exact(sim: Simulation) -> None:
    for rid, out in sim.outcomes.items():
        assert out.finish_reason in (FINISH_STOP, FINISH_LENGTH), (rid, out.finish_reason, out.error_kind)
        assert out.tokens == MODEL.reference(sim.reqs[rid]), rid


def _group_of(sim: Simulation, rid: str) -> str:
    return next(name for name, w in sim.workers.items() if rid in w.rids_seen)


def test_cache_aware_hits_as_often_as_one_group_and_round_robin_less() -> None:
    def hit_rate(groups: int, policy: str) -> float:
        sim = _run(_sim(groups, routing_policy=policy), shared_prefix_workload(8, 8, seed=1, rate_per_s=20.0))
        _assert_exact(sim)
        return _hit_rate(sim)

    one, aware, rr = hit_rate(1, "cache_aware"), hit_rate(2, "cache_aware"), hit_rate(2, "round_robin")
    print(f"prompt tokens found in the cache: one group {one:.3f}, cache_aware {aware:.3f}, round_robin {rr:.3f}")
    assert aware >= one - 0.02, (aware, one)
    assert rr <= aware - 0.06, (rr, aware)


def test_when_every_pool_is_full_requests_wait_for_the_group_that_has_their_prefix() -> None:
    """All at once, more prefixes than one pool holds, and statuses that reach the router one at
    a time (as they do): each admission round sees one group's room. A request that took whichever
    group had room would bring every prefix to both groups, as round_robin does."""

    def run(groups: int, policy: str) -> Simulation:
        workers = [SimWorker(str(g), 12_500 // groups, MODEL, prompt_cache=True) for g in range(groups)]
        sim = Simulation(RouterConfig(replica="sim", routing_policy=policy), workers, tick_each_status=True)
        _run(sim, shared_prefix_workload(32, 16, seed=4, prefix_len=256, suffix_len=16, max_new=32))
        _assert_exact(sim)
        return sim

    one, aware, rr = run(1, "cache_aware"), run(2, "cache_aware"), run(2, "round_robin")
    print(
        f"hit rate: one group {_hit_rate(one):.3f}, cache_aware {_hit_rate(aware):.3f}, round_robin "
        f"{_hit_rate(rr):.3f}; seconds: {one.t:.2f}, {aware.t:.2f}, {rr.t:.2f}"
    )
    assert _hit_rate(aware) >= 0.9 * _hit_rate(one)
    assert _hit_rate(rr) <= _hit_rate(aware) - 0.08
    assert rr.t >= 1.15 * aware.t


def test_requests_sharing_a_prefix_go_to_the_group_that_has_it() -> None:
    sim = _run(_sim(), shared_prefix_workload(2, 12, seed=2, rate_per_s=10.0))
    by_prefix: dict[str, set[str]] = {}
    for rid in sim.reqs:
        by_prefix.setdefault(rid.split("-")[1], set()).add(_group_of(sim, rid))
    # each prefix stays on one group, except the first requests, placed before a status showed the cache
    firsts = {rid for rid, r in sim.reqs.items() if r.arrival - T0_UNIX < 0.5}
    late = {
        p: {_group_of(sim, rid) for rid in sim.reqs if rid.split("-")[1] == p and rid not in firsts} for p in by_prefix
    }
    assert all(len(groups) == 1 for groups in late.values()), late
    assert late["0"] != late["1"]  # and the two prefixes on different groups
    _assert_exact(sim)


def _random_shared_prefix_workload(n: int, seed: int, rate_per_s: float) -> list[GenerateReq]:
    """Prompts cut from a dozen prefixes at random lengths, plus suffixes of their own; outputs
    of any length, half with ignore_eos."""
    rng = random.Random(seed)
    heads = [[rng.randint(1, 49_999) for _ in range(rng.randint(20, 800))] for _ in range(12)]
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate_per_s)
        head = rng.choice(heads)
        prompt = head[: rng.randint(len(head) // 2, len(head))] + [
            rng.randint(1, 49_999) for _ in range(rng.randint(1, 300))
        ]
        params = SamplingParams(max_new_tokens=rng.randint(4, 400), ignore_eos=rng.random() < 0.5)
        out.append(GenerateReq(f"x{seed}-{i}", "front", "detok", prompt, params, T0_UNIX + t, 0.0))
    return out


def test_pools_never_overflow_and_requests_are_not_paused_under_a_random_shared_prefix_workload() -> None:
    for policy in ("cache_aware", "least_loaded", "round_robin"):
        sim = _run(_sim(capacity=3_000, routing_policy=policy), _random_shared_prefix_workload(300, 1, 30.0))
        pools = [w.pool for w in sim.workers.values()]
        print(
            f"{policy}: hit rate {_hit_rate(sim):.3f}, pauses {sim.pauses()}, {sum(p.evicted for p in pools)} evicted"
        )
        assert all(p.peak_used <= p.capacity for p in pools)  # and asserted at every allocation
        assert all(p.evicted for p in pools), "the caches never filled their pools: eviction went untested"
        assert sim.pauses() <= len(sim.reqs) // 100  # the estimate holds with the cache as without it
        _assert_exact(sim)


def test_a_pool_full_of_cache_still_admits() -> None:
    sim = _sim(groups=1, capacity=2_000)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    first = [
        GenerateReq(f"a{i}", "f", "d", [i * 1_000 + j for j in range(1, 151)], params, T0_UNIX, 0.0) for i in range(20)
    ]
    _run(sim, first)
    w = sim.workers["0"]
    sim.run_until(sim.t + 1.0)  # a status reports the pool idle
    g = sim.core.groups["0"]
    assert g.free_tokens < 200 and g.evictable_tokens > 1_800  # the cache has taken the pool
    second = [GenerateReq(f"b{i}", "f", "d", [60_000 + i] * 300, params, sim.now_unix, 0.0) for i in range(4)]
    _run(sim, second)
    assert {f"b{i}" for i in range(4)} <= w.rids_seen
    _assert_exact(sim)


def test_a_group_that_restarts_or_dies_loses_its_index() -> None:
    sim = _sim()
    reqs = shared_prefix_workload(1, 6, seed=3, rate_per_s=5.0)
    _run(sim, reqs[:4])
    home = _group_of(sim, reqs[3].rid)
    assert sim.core.stats.routed.get((home, True)), "the prefix never went to the group that has it"
    sim.restart(home)
    sim.run_until(sim.t + 1.0)  # its new instance's status reaches the router
    assert sim.core.groups[home].index.size == 0
    before = dict(sim.core.stats.routed)
    _run(sim, [_later(reqs[4], sim)])
    assert sum(sim.core.stats.routed.values()) - sum(before.values()) == 1
    assert all(n == before.get(k, 0) for k, n in sim.core.stats.routed.items() if k[1]), "routed as a hit"
    home = _group_of(sim, reqs[4].rid)
    sim.kill(home)
    sim.run_until(sim.t + sim.cfg.worker_dead_after_s + 0.2)
    assert home not in sim.core.groups
    _run(sim, [_later(reqs[5], sim)])
    assert _group_of(sim, reqs[5].rid) != home


def _later(req: GenerateReq, sim: Simulation) -> GenerateReq:
    return GenerateReq(req.rid, req.front, req.detok, req.input_ids, req.params, sim.now_unix, 0.0)
