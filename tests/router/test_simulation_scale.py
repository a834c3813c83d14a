"""The router and the worker's prompt-cache rules at the GPU routing run's scale, in simulation
(opt-in: pytest -m bench -s tests/router/test_simulation_scale.py, about a minute): shared_prefix
(64 system prompts of 2,048 tokens, 16 requests each, 128-token questions, 256 output tokens, all
at once) on two groups of 100,000 tokens under cache_aware and round_robin and on one group of
200,000, each worker with a 16,384-token prefill budget and 2,048 running requests as
tools/bench_prompt_cache.py starts them, both groups known before the first request. Prints each
setting's share of prompt tokens found in the cache (docs/performance.md, docs/router.md quote it)."""

from __future__ import annotations

import statistics

import pytest

from shared.config import RouterConfig
from tests.router.sim_worker import SimModel, SimWorker
from tests.router.simulation import Simulation, shared_prefix_workload

SEEDS = (4, 5, 6)


def _hit_rate(groups: int, capacity: int, policy: str, seed: int) -> float:
    model = SimModel(eos_one_in=64)
    workers = [
        SimWorker(str(g), capacity, model, prefill_budget=16_384, max_running=2048, prompt_cache=True)
        for g in range(groups)
    ]
    cfg = RouterConfig(replica="sim", routing_policy=policy, running_max_req_size=4096, max_waiting=20_000)
    sim = Simulation(cfg, workers, tick_each_status=True)
    sim.run_until(1.0)  # the groups report before the first request, as after the benchmark's warm-up
    for req in shared_prefix_workload(64, 16, seed=seed, prefix_len=2048, suffix_len=128, max_new=256):
        sim.submit(req)
    sim.run_until_done(10_000)
    assert all(o.finish_reason == "length" for o in sim.outcomes.values())
    return sum(w.pool.hit_tokens for w in workers) / sum(w.pool.prompt_tokens for w in workers)


@pytest.mark.bench
def test_cache_aware_keeps_most_of_one_groups_hit_rate_at_the_gpu_runs_scale() -> None:
    rates = {
        name: statistics.mean(_hit_rate(groups, capacity, policy, s) for s in SEEDS)
        for name, groups, capacity, policy in (
            ("cache_aware", 2, 100_000, "cache_aware"),
            ("one group", 1, 200_000, "cache_aware"),
            ("round_robin", 2, 100_000, "round_robin"),
        )
    }
    print("share of prompt tokens found in the cache:", {k: round(v, 3) for k, v in rates.items()})
    assert rates["cache_aware"] >= 0.95 * rates["one group"]
    assert rates["round_robin"] <= rates["cache_aware"] - 0.15
