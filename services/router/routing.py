"""Which group takes a request: the routing policies (RouterConfig.routing_policy).

least_loaded and round_robin choose among the groups that can take the request now
(GroupState.can_take); with none, the request waits at the head of the queue. cache_aware
chooses among every group that could ever hold it (``prefer``): when that group is full the
request waits for it, in that group's lane, while requests behind it that prefer another group
go on (RouterCore._admit_by_lane), as does one whose prompt prefix the requests placed on that
group hold, up to cache_aware_max_overtake times per waiting request (``_open``: the group's
cache surely has the prefix, and the request adds only its own tokens). Choosing only among
groups with room would, once every pool is full, send each request to whichever group's status
freed room last, whatever its prefix: each group would then see every prefix and the caches
would thrash as under round_robin.

- least_loaded: the most KV tokens free by the router's count (ties: fewer requests). Not the
  room left under the peak estimate: a short request leaves a group's peak as it was, so that
  room would send every short request to the same group.
- round_robin: the next group in name order after the one chosen last.
- cache_aware (SGLang's cache-aware router, over the router's per-group prefix index): the
  group whose index matches the longest prefix of the prompt, unless its match is hardly
  longer than that of the group least_loaded would pick (by less than cache_aware_min_match
  of the prompt), or it holds more than cache_aware_balance_margin requests more than the least
  loaded group and more than cache_aware_balance_rel times as many (counting the requests already
  waiting in each group's lane); then the group that can take it now with the most room, or with
  none, the one with the fewest requests placed and waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from services.router.group import GroupState, PrefixLookup
from shared.config import RouterConfig
from shared.messages import GenerateReq


@dataclass(frozen=True)
class Candidate:
    group: GroupState
    look: PrefixLookup

    @property
    def matched(self) -> int:
        """Prompt tokens the group's cache probably holds."""
        return self.look.matched


OVERTAKE_SCAN = 16  # requests looked at once every lane is blocked: only one that may overtake can go on


@dataclass
class LaneRound:
    """One admission round under cache_aware: the requests found waiting for each group (its
    lane is blocked once one does), and each group's room by the router's count, kept until a
    request is placed there (it is a sum over the group's requests)."""

    waiting: dict[str, int] = field(default_factory=dict)
    _headroom: dict[str, int] = field(default_factory=dict)
    _past: int = 0  # requests looked at since every lane was blocked

    def over(self, live: list[GroupState], max_overtake: int) -> bool:
        """The round can end: every lane is blocked and either OVERTAKE_SCAN requests have been
        looked at since, or no group's waiting request may be overtaken any more."""
        if not all(self.blocked(g) for g in live):
            return False
        if self._past >= OVERTAKE_SCAN or all(g.overtaken >= max_overtake for g in live):
            return True
        self._past += 1
        return False

    def blocked(self, g: GroupState) -> bool:
        return g.name in self.waiting

    def wait_for(self, g: GroupState, req: GenerateReq) -> None:
        if g.name not in self.waiting and g.lane_head != req.rid:  # a new head: nothing has overtaken it yet
            g.lane_head, g.overtaken = req.rid, 0
        self.waiting[g.name] = self.waiting.get(g.name, 0) + 1

    def placed_on(self, g: GroupState) -> None:
        if self.blocked(g):  # it started ahead of the request g's lane waits for
            g.overtaken += 1
        self._headroom.pop(g.name, None)

    def headroom(self, g: GroupState) -> int:
        if g.name not in self._headroom:
            self._headroom[g.name] = g.headroom()
        return self._headroom[g.name]

    def queued(self, g: GroupState) -> int:
        """Requests placed on the group and waiting in its lane."""
        return len(g.placed) + self.waiting.get(g.name, 0)


class Routing:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self._last = ""  # round_robin: the group chosen last
        policies: dict[str, Callable[[list[Candidate]], Candidate]] = {
            "least_loaded": least_loaded,
            "round_robin": self._round_robin,
        }
        self._policy = policies.get(cfg.routing_policy, least_loaded)

    @property
    def by_lane(self) -> bool:
        """Requests wait for the group they prefer (``prefer``), not for any group with room."""
        return self.cfg.routing_policy == "cache_aware"

    def choose(self, req: GenerateReq, groups: Iterable[GroupState]) -> Candidate | None:
        """least_loaded's or round_robin's group for req, of those that can take it now; None: none can."""
        cands = []
        for g in groups:
            look = g.lookup(req)
            if g.can_take(req, look, self.cfg):
                cands.append(Candidate(g, look))
        return self._policy(cands) if cands else None

    def prefer(self, req: GenerateReq, groups: Iterable[GroupState], rnd: LaneRound) -> tuple[Candidate, bool] | None:
        """cache_aware's group for req among those not draining whose pool could hold it alone,
        whether or not it can take req now, and whether it can (a group whose lane is blocked
        cannot: req would overtake the request waiting there). None: no group could hold it."""
        alone = req.prompt_len + req.params.max_new_tokens
        cands = [Candidate(g, g.lookup(req)) for g in groups if not g.draining and g.capacity >= alone]
        if not cands:
            return None
        now = [c for c in cands if self._open(req, c, rnd) and c.group.can_take(req, c.look, self.cfg)]
        queued = {c.group.name: rnd.queued(c.group) for c in cands}
        if now:  # least_loaded among them
            fallback = max(now, key=lambda c: (rnd.headroom(c.group), -len(c.group.placed)))
        else:
            fallback = min(cands, key=lambda c: (queued[c.group.name], -rnd.headroom(c.group)))
        best = max(cands, key=lambda c: (c.matched, -queued[c.group.name]))
        hardly_longer = best.matched - fallback.matched < max(self.cfg.cache_aware_min_match * len(req.input_ids), 1)
        most, least = queued[best.group.name], min(queued.values())
        too_far_ahead = (
            most - least > self.cfg.cache_aware_balance_margin and most > self.cfg.cache_aware_balance_rel * least
        )
        chosen = fallback if hardly_longer or too_far_ahead else best
        return chosen, any(c is chosen for c in now)

    def _open(self, req: GenerateReq, c: Candidate, rnd: LaneRound) -> bool:
        """Whether req may start on c's group in this round: its lane is not blocked, or req's prompt
        prefix is held by requests running there (its cache surely has it; req adds only its own
        tokens) and the request the lane waits for has not been overtaken too often."""
        g = c.group
        if not rnd.blocked(g):
            return True
        held = len(req.input_ids) - c.look.adds
        return g.overtaken < self.cfg.cache_aware_max_overtake and self.is_hit(req, held)

    def is_hit(self, req: GenerateReq, matched: int) -> bool:
        """A placement that reuses a prefix worth routing for (the figures count these)."""
        return matched > 0 and matched >= self.cfg.cache_aware_min_match * len(req.input_ids)

    def _round_robin(self, cands: list[Candidate]) -> Candidate:
        ordered = sorted(cands, key=lambda c: c.group.name)
        chosen = next((c for c in ordered if c.group.name > self._last), ordered[0])
        self._last = chosen.group.name
        return chosen


def least_loaded(cands: list[Candidate]) -> Candidate:
    return max(cands, key=lambda c: (c.group.headroom(), -len(c.group.placed)))  # the first of equals: joined first
