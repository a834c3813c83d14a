"""A draining worker group (services/worker/service.py): the router places nothing more on it,
and when it leaves, what it still lists, and what was placed there after its last status, is
handed over to go on elsewhere."""

from __future__ import annotations

from dataclasses import replace

from services.router.actions import Actions
from services.router.core import RouterCore
from shared.config import RouterConfig
from shared.messages import RunningReq
from tests.router.test_handover import _req, _status, _two_groups_with


def test_a_draining_group_gets_no_new_request_and_keeps_those_it_runs() -> None:
    core, _ = _two_groups_with(["a"])
    act = Actions()
    core.on_status(replace(_status("0", [RunningReq("a", "d", 10, 13, 17)]), draining=True), 0.2, act)
    for i in range(4):
        core.on_generate(_req(f"new{i}", arrival=1.0 + i), 1.0, act)
    core.tick(0.3, 1.0, act)
    placed = {name for (name, _), reqs in act.admits.items() if reqs}
    assert placed == {"1"} and len(act.admits[("1", "inst-1")]) == 4
    assert not act.handovers and not act.aborts and core.where["a"] == "0"


def test_a_leaving_group_hands_over_what_it_lists_and_what_it_never_took_in() -> None:
    core = RouterCore(RouterConfig(replica="t", routing_policy="round_robin"))
    core.on_status(_status("0", []), 0.0, Actions())
    act = Actions()
    core.on_generate(_req("run"), 0.0, act)
    core.on_generate(_req("late", arrival=1.0), 0.0, act)
    core.tick(0.0, 0.0, act)
    core.seal_admissions(act)
    # the group took "run" in and leaves before it reads "late"'s admission; "done" ended there
    last = _status("0", [RunningReq("run", "d", 10, 13, 17)])
    act = Actions()
    core.on_status(replace(last, leaving=True, draining=True), 0.5, act)
    assert sorted(req.rid for req, _ in act.handovers) == ["late", "run"]
    assert {why for _, why in act.handovers} == {"worker group 0 shut down"}
    assert "0" not in core.groups and not core.where and not act.ended
    # a status from the instance that left: what it holds there is stopped, not run twice
    act = Actions()
    core.on_status(_status("0", [RunningReq("run", "d", 10, 13, 17)]), 0.6, act)
    assert act.aborts == {"0": ["run"]}
