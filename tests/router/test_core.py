"""RouterCore's knobs and edge paths, one decision at a time (no simulation)."""

from __future__ import annotations

from dataclasses import replace

from services.router.actions import Actions
from services.router.core import RouterCore
from services.router.group import SEQ_GAP
from shared.config import RouterConfig
from shared.messages import (
    ERR_DEADLINE,
    ERR_FAILED,
    ERR_OVERLOADED,
    FINISH_ABORT,
    GenerateReq,
    RunningReq,
    RunningTable,
    SamplingParams,
    WorkerStatus,
)


def _req(rid: str, prompt: int, max_new: int, ignore_eos: bool = True, arrival: float = 0.0) -> GenerateReq:
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=ignore_eos)
    return GenerateReq(rid, "f", "d", [1] * prompt, params, arrival, 0.0)


def _status(
    group: str,
    capacity: int,
    running: list[RunningReq] | None = None,
    seq: int = 0,
    max_running: int = 64,
    instance: str = "",
    free: int | None = None,
) -> WorkerStatus:
    running = running or []
    if free is None:
        free = capacity - sum(r.held_tokens for r in running)
    table = RunningTable.of(running)
    return WorkerStatus(group, instance or "inst-" + group, capacity, free, max_running, seq, table, 0.0)


def _admitted(act: Actions) -> list[str]:
    return [r.rid for reqs in act.admits.values() for r in reqs]


def _ended(act: Actions) -> dict[str, tuple[str, str]]:
    return {i.rid: (i.finish_reason, i.error_kind) for items in act.ended.values() for i in items}


def _core(**kw) -> RouterCore:
    return RouterCore(RouterConfig(replica="t", **kw))


def test_the_queue_bound_rejects_with_overloaded() -> None:
    core = _core(max_waiting=2)
    act = Actions()
    for i in range(3):
        core.on_generate(_req(str(i), 10, 10), 0.0, act)  # no group yet: all wait
    assert [r.rid for r in core.waiting] == ["0", "1"]
    assert _ended(act) == {"2": ("error", ERR_OVERLOADED)}
    assert act.released == ["2"]
    assert core.figures(0.0).rejected == {ERR_OVERLOADED: 1}


def test_running_max_req_size_and_the_groups_own_limit_cap_placement() -> None:
    core = _core(running_max_req_size=3)
    act = Actions()
    core.on_status(_status("0", 10_000), 0.0, act)
    for i in range(5):
        core.on_generate(_req(str(i), 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert _admitted(act) == ["0", "1", "2"]
    core = _core(running_max_req_size=100)
    act = Actions()
    core.on_status(_status("0", 10_000, max_running=2), 0.0, act)
    for i in range(5):
        core.on_generate(_req(str(i), 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert _admitted(act) == ["0", "1"]


def test_the_prefill_budget_limits_unstarted_prompt_tokens_but_never_blocks_a_long_prompt() -> None:
    core = _core(batch_max_tokens=100)
    act = Actions()
    core.on_status(_status("0", 10_000), 0.0, act)
    for rid, prompt in (("a", 60), ("b", 30), ("c", 30), ("long", 500)):
        core.on_generate(_req(rid, prompt, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert _admitted(act) == ["a", "b"]  # 60 + 30 + 30 would pass the budget
    # once the group reports output for them, their prompts are no longer waiting for a prefill
    act = Actions()
    running = [RunningReq("a", "d", 60, 61, 9), RunningReq("b", "d", 30, 31, 9)]
    core.on_status(_status("0", 10_000, running, seq=SEQ_GAP), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert _admitted(act) == ["c"]
    act = Actions()
    running.append(RunningReq("c", "d", 30, 31, 9))
    core.on_status(_status("0", 10_000, running, seq=SEQ_GAP + 1), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert _admitted(act) == ["long"]  # longer than the budget, placed when nothing else waits for a prefill


def test_token_ratio_and_guess_length_follow_lightllm() -> None:
    # 10 prompt tokens and up to 500 output, without ignore_eos: 510 tokens each at full length
    def admitted(ratio: float, used: int, ignore_eos: bool) -> int:
        core = _core(router_token_ratio=ratio, router_max_new_token_len=40)
        act = Actions()
        core.on_status(_status("0", 2_000, free=2_000 - used), 0.0, act)
        for i in range(20):
            core.on_generate(_req(str(i), 10, 500, ignore_eos=ignore_eos), 0.0, act)
        core.tick(0.0, 0.0, act)
        return len(_admitted(act))

    assert admitted(0.0, 0, ignore_eos=False) == 3  # ratio 0: always busy, full max_new_tokens: 4 x 510 > 2000
    assert admitted(0.5, 0, ignore_eos=False) == 20  # not busy: each counted at 10 + 40 tokens
    assert admitted(0.5, 1_200, ignore_eos=False) == 3  # busy (60% used): full length again
    assert admitted(0.5, 0, ignore_eos=True) == 3  # ignore_eos: always the full length


def test_a_duplicate_delivery_is_released_and_not_queued_twice() -> None:
    core = _core()
    act = Actions()
    core.on_generate(_req("x", 10, 10), 0.0, act)
    core.on_generate(_req("x", 10, 10), 0.0, act)
    assert len(core.waiting) == 1 and act.released == ["x"]


def test_an_abort_that_overtakes_its_request_ends_it_when_it_arrives() -> None:
    core = _core()
    act = Actions()
    core.on_abort("early", 0.0, act)
    core.on_generate(_req("early", 10, 10), 0.0, act)
    assert _ended(act) == {"early": (FINISH_ABORT, "")} and not core.waiting
    # a running request a restarted router hears of only from a status
    act = Actions()
    core.on_abort("running", 0.0, act)
    core.on_status(_status("0", 1_000, [RunningReq("running", "d", 10, 15, 5)]), 0.0, act)
    assert act.aborts == {"0": ["running"]}


def test_remembered_aborts_expire() -> None:
    core = _core()
    act = Actions()
    core.on_abort("gone", 0.0, act)
    core.tick(core.recent_aborts.ttl_s + 1.0, 0.0, act)
    assert "gone" not in core.recent_aborts


def test_queued_requests_fail_when_no_group_is_alive() -> None:
    core = _core(worker_dead_after_s=3.0)
    act = Actions()
    core.on_status(_status("0", 100, [RunningReq("big", "d", 50, 50, 50)]), 0.0, act)
    core.on_generate(_req("waits", 10, 60), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert not _admitted(act)
    act = Actions()
    core.tick(3.5, 0.0, act)  # the group is declared dead; "big" had no output: it is learnt, so it fails
    assert "0" not in core.groups and _ended(act) == {"big": ("error", ERR_FAILED)}
    act = Actions()
    core.tick(5.0, 0.0, act)
    assert not _ended(act)
    core.tick(7.0, 0.0, act)
    assert _ended(act) == {"waits": ("error", ERR_FAILED)}


def test_silence_while_redis_was_away_is_excused() -> None:
    core = _core(worker_dead_after_s=3.0)
    act = Actions()
    core.on_status(_status("0", 100, [RunningReq("running", "d", 5, 5, 50)]), 0.0, act)
    core.excuse_silence(2.5)  # Redis away until 2.5: no status could come
    core.tick(5.0, 0.0, act)
    assert "0" in core.groups and not _ended(act)
    core.tick(5.6, 0.0, act)  # silent 3.1 s since Redis came back: its own silence now
    assert "0" not in core.groups and _ended(act) == {"running": ("error", ERR_FAILED)}


def test_a_request_deadline_passed_on_arrival_is_rejected() -> None:
    core = _core()
    act = Actions()
    req = GenerateReq("late", "f", "d", [1], SamplingParams(), 0.0, 5.0)
    core.on_generate(req, 10.0, act)
    assert _ended(act) == {"late": ("error", ERR_DEADLINE)}


def test_a_restarted_group_ends_what_it_held_and_rejoins() -> None:
    core = _core()
    act = Actions()
    core.on_status(_status("0", 1_000), 0.0, act)
    core.on_generate(_req("a", 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    core.seal_admissions(act)
    act = Actions()
    core.on_status(_status("0", 1_000, instance="new"), 1.0, act)  # a new instance: the old one died
    assert [(req.rid, why) for req, why in act.handovers] == [("a", "its worker restarted")]
    # its detokenizer shard sends it back to go on (no output yet: as it was)
    req = act.handovers[0][0]
    core.on_generate(replace(req, handovers=1), 0.0, act)
    core.tick(1.0, 0.0, act)
    assert list(act.admits) == [("0", "new")]


def test_admission_seqs_start_past_any_a_predecessor_may_have_sent() -> None:
    core = _core()
    act = Actions()
    core.on_status(_status("0", 1_000, seq=7), 0.0, act)
    core.on_generate(_req("a", 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert act.admit_seqs[("0", "inst-0")] == 7 + SEQ_GAP


def test_figures_count_what_happened() -> None:
    core = _core()
    act = Actions()
    running = [RunningReq("p", "d", 10, 30, 70, paused=True), RunningReq("r", "d", 10, 20, 500)]
    core.on_status(_status("0", 1_000, running, free=980), 0.0, act)
    core.on_generate(_req("a", 10, 10), 0.0, act)
    core.on_generate(_req("w", 10, 900), 5.0, act)  # fits alone, not beside "r"
    core.tick(0.0, 10.0, act)
    f = core.figures(10.0)
    assert (f.waiting, f.running, f.paused) == (1, 3, 1)
    assert f.admitted == {"0": 1} and f.oldest_wait_s == 10.0
    assert f.groups[0].used_tokens == 20 and f.groups[0].capacity_tokens == 1_000
    info = f.info()
    assert info["waiting"] == 1 and info["group_0_used_fraction"] == 0.02


def test_short_requests_spread_over_groups_whose_peaks_they_do_not_change() -> None:
    core = _core()
    act = Actions()
    for g in ("0", "1"):
        core.on_status(_status(g, 2_000, [RunningReq("long-" + g, "d", 10, 20, 600)]), 0.0, act)
    for i in range(6):
        core.on_generate(_req(f"s{i}", 10, 8), 0.0, act)
    core.tick(0.0, 0.0, act)
    assert {g: len(reqs) for (g, _), reqs in act.admits.items()} == {"0": 3, "1": 3}


def test_an_aborted_request_is_not_revived() -> None:
    core = _core()
    act = Actions()
    core.on_status(_status("0", 1_000), 0.0, act)
    core.on_generate(_req("placed", 10, 10), 0.0, act)
    core.tick(0.0, 0.0, act)
    core.seal_admissions(act)
    # its abort is on the way to the group when the group dies: it ends, it is not re-queued
    act = Actions()
    core.on_abort("placed", 1.0, act)
    core.tick(10.0, 0.0, act)
    assert not act.handovers and _ended(act) == {"placed": (FINISH_ABORT, "")}
    # aborted while queued, then its second copy arrives (a claimed entry)
    act = Actions()
    core.on_generate(_req("queued", 10, 10), 0.0, act)
    core.on_abort("queued", 11.0, act)
    core.on_generate(_req("queued", 10, 10), 0.0, act)
    assert not core.waiting and list(_ended(act)) == ["queued"]


def test_a_request_a_predecessor_admitted_is_learnt_from_a_later_status_and_can_be_aborted() -> None:
    core = _core()
    act = Actions()
    core.on_status(_status("0", 1_000), 0.0, act)
    core.on_status(_status("0", 1_000, [RunningReq("late", "d", 10, 12, 8)], seq=3), 0.5, act)
    assert core.where == {"late": "0"}
    act = Actions()
    core.on_abort("late", 1.0, act)
    assert act.aborts == {"0": ["late"]}


def test_a_request_whose_deadline_passed_is_never_admitted() -> None:
    core = _core()
    act = Actions()
    core.on_generate(GenerateReq("late", "f", "d", [1], SamplingParams(), 0.0, 5.0), 4.0, act)
    core.tick(0.0, 4.0, act)  # no group yet: it waits
    act = Actions()
    core.on_status(_status("0", 1_000), 0.01, act)  # room arrives after its deadline, before the next scan
    core.tick(0.02, 6.0, act)
    assert not act.admits and _ended(act) == {"late": ("error", ERR_DEADLINE)}
