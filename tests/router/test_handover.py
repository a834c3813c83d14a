"""A dead group's requests handed over through their detokenizer shards (docs/router.md,
Failures), one decision at a time: what goes where, and what ends instead."""

from __future__ import annotations

from dataclasses import replace

from services.router.actions import Actions
from services.router.core import MAX_HANDOVERS, RouterCore
from services.router.group import SEQ_GAP
from shared.config import RouterConfig
from shared.messages import (
    ERR_FAILED,
    FINISH_ABORT,
    GenerateReq,
    RunningReq,
    RunningTable,
    SamplingParams,
    WorkerStatus,
)


def _req(rid: str, arrival: float = 0.0) -> GenerateReq:
    return GenerateReq(rid, "f", "d", [7] * 10, SamplingParams(max_new_tokens=20, ignore_eos=True), arrival, 0.0)


def _status(group: str, running: list[RunningReq], instance: str = "", seq: int = SEQ_GAP) -> WorkerStatus:
    table = RunningTable.of(running)
    held = sum(r.held_tokens for r in running)
    return WorkerStatus(group, instance or "inst-" + group, 1_000, 1_000 - held, 64, seq, table, 0.0)


def _back(req: GenerateReq, output: list[int]) -> GenerateReq:
    """What the request's shard sends back: the prompt and the output its client had."""
    prompt = req.input_ids[: req.prompt_len]
    return replace(req, input_ids=prompt + output, resumed=len(output), handovers=req.handovers + 1)


def _two_groups_with(rids: list[str]) -> tuple[RouterCore, Actions]:
    """Group 0 runs rids (each with 3 tokens of output), group 1 is idle; both alive at t=0."""
    core = RouterCore(RouterConfig(replica="t", routing_policy="round_robin"))
    act = Actions()
    core.on_status(_status("0", []), 0.0, act)
    for i, rid in enumerate(rids):
        core.on_generate(_req(rid, arrival=float(i)), 0.0, act)
    core.tick(0.0, 0.0, act)
    core.seal_admissions(act)
    core.on_status(_status("0", [RunningReq(rid, "d", 10, 13, 17) for rid in rids]), 0.1, Actions())
    core.on_status(_status("1", []), 0.1, Actions())
    return core, act


def test_a_dead_groups_requests_go_to_their_shards_and_come_back_in_their_place_in_line() -> None:
    core, _ = _two_groups_with(["a", "b"])
    act = Actions()
    core.on_generate(_req("later", arrival=5.0), 5.0, act)
    core.on_generate(_req("later2", arrival=6.0), 5.0, act)
    core.tick(3.5, 10.0, act)  # both groups silent for 3.4 s: dead; the later ones wait
    handed = {req.rid: why for req, why in act.handovers}
    assert handed == {"a": "worker group 0 died", "b": "worker group 0 died"} and not act.ended
    assert core.stats.requeued == 2 and not core.stats.failed
    act = Actions()
    core.on_generate(_back(_req("b", 1.0), [4, 5, 6]), 10.0, act)
    core.on_generate(_back(_req("a", 0.0), [1, 2, 3]), 10.0, act)
    assert [r.rid for r in core.waiting] == ["a", "b", "later", "later2"]  # ahead of later arrivals
    core.on_status(_status("1", []), 3.6, act)
    core.tick(3.6, 10.0, act)
    admitted = [r for reqs in act.admits.values() for r in reqs]
    assert [r.rid for r in admitted] == ["a", "b", "later", "later2"]
    a = admitted[0]
    assert (a.input_ids[10:], a.resumed, a.handovers) == ([1, 2, 3], 3, 1)
    placed = core.groups["1"].placed["a"]
    assert (placed.prompt_tokens, placed.output_tokens, placed.remaining, placed.paused) == (10, 3, 17, True)


def test_a_request_known_only_from_a_status_ends_with_an_error_when_its_group_dies() -> None:
    core = RouterCore(RouterConfig(replica="t"))
    core.on_status(_status("0", [RunningReq("learnt", "d", 10, 13, 17)], seq=4), 0.0, Actions())
    act = Actions()
    core.tick(4.0, 0.0, act)
    assert not act.handovers
    (item,) = act.ended["d"]
    assert (item.rid, item.error_kind, item.finish_reason) == ("learnt", ERR_FAILED, "error")
    assert "worker group 0 died" in item.error


def test_an_abort_during_the_hand_over_ends_the_request_when_it_comes_back() -> None:
    core, _ = _two_groups_with(["a"])
    act = Actions()
    core.on_status(_status("1", []), 3.0, act)
    core.tick(3.5, 0.0, act)
    assert [req.rid for req, _ in act.handovers] == ["a"]
    act = Actions()
    core.on_abort("a", 3.6, act)
    core.on_generate(_back(_req("a"), [1]), 0.0, act)
    assert not core.waiting and [(i.rid, i.finish_reason) for i in act.ended["d"]] == [("a", FINISH_ABORT)]


def test_a_request_that_keeps_killing_its_groups_ends() -> None:
    core = RouterCore(RouterConfig(replica="t"))
    act = Actions()
    req = replace(_req("poison"), handovers=MAX_HANDOVERS + 1)
    core.on_generate(req, 0.0, act)
    assert not core.waiting and act.ended["d"][0].error_kind == ERR_FAILED
    assert f"died {MAX_HANDOVERS + 1} times" in act.ended["d"][0].error


def test_a_group_that_was_only_silent_has_its_copies_stopped() -> None:
    core, _ = _two_groups_with(["a"])
    act = Actions()
    core.on_status(_status("1", []), 3.0, act)
    core.tick(3.5, 0.0, act)
    assert [req.rid for req, _ in act.handovers] == ["a"]
    act = Actions()
    core.on_generate(_back(_req("a"), [1, 2, 3]), 0.0, act)  # back from its shard, waiting
    # group 0 wakes up (same instance), still running its copy
    core.on_status(_status("0", [RunningReq("a", "d", 10, 15, 15)]), 3.6, act)
    assert act.aborts == {"0": ["a"]} and [r.rid for r in core.waiting] == ["a"]


def test_an_older_copy_a_restarted_router_took_back_is_stopped_when_the_new_one_comes() -> None:
    core = RouterCore(RouterConfig(replica="t"))
    # a router that restarted learns "a" from group 0, which its predecessor had declared dead
    core.on_status(_status("0", [RunningReq("a", "d", 10, 15, 15)], seq=3), 0.0, Actions())
    act = Actions()
    core.on_generate(_back(_req("a"), [1, 2, 3]), 0.0, act)
    assert act.aborts == {"0": ["a"]} and [r.rid for r in core.waiting] == ["a"]
    # a second delivery of the same copy is a duplicate, not a newer copy
    act = Actions()
    core.on_generate(_back(_req("a"), [1, 2, 3]), 0.0, act)
    assert not act.aborts and act.released == ["a"] and len(core.waiting) == 1


def test_redis_away_does_not_count_towards_a_groups_death() -> None:
    core, _ = _two_groups_with(["a"])
    act = Actions()
    core.excuse_silence(12.0)  # the router's reads failed from about t=0.2 to t=12: no status could come
    core.tick(12.1, 0.0, act)
    assert set(core.groups) == {"0", "1"} and not act.handovers
    core.tick(15.5, 0.0, act)  # silent 3.5 s since Redis came back: dead now
    assert not core.groups and {req.rid for req, _ in act.handovers} == {"a"}
