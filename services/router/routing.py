"""Which group takes a request: the routing policies (RouterConfig.routing_policy).

least_loaded and round_robin choose among the groups that can take the request now
(GroupState.can_take); with none, the request waits at the head of the queue. cache_aware
chooses among every group that could ever hold it (``prefer``): when that group is full the
request waits for it, in that group's lane, while requests behind it that prefer another group
go on (RouterCore._admit_by_lane). Choosing only among groups with room would, once every pool
is full, send each request to whichever group's status freed room last, whatever its prefix:
each group would then see every prefix and the caches would thrash as under round_robin.

- least_loaded: the most KV tokens free by the router's count (ties: fewer requests). Not the
  room left under the peak estimate: a short request leaves a group's peak as it was, so that
  room would send every short request to the same group.
- round_robin: the next group in name order after the one chosen last.
- cache_aware (SGLang's cache-aware router, over the router's per-group prefix index): the
  group whose index matches the longest prefix of the prompt, unless its match is hardly
  longer than that of the group least_loaded would pick (by less than cache_aware_min_match
  of the prompt), or it holds more than cache_aware_balance_margin requests more than the
  group (counting the requests already waiting in each group's lane); then the group that can
  take it now with the most room, or with none, the one with the fewest requests placed and waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

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


class Routing:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self._last = ""  # round_robin: the group chosen last
        policies: dict[str, Callable[[GenerateReq, list[Candidate]], Candidate]] = {
            "cache_aware": self._cache_aware,
            "least_loaded": lambda req, cands: least_loaded(cands),
            "round_robin": self._round_robin,
        }
        self._policy = policies[cfg.routing_policy]

    def choose(self, req: GenerateReq, groups: Iterable[GroupState]) -> Candidate | None:
        """The group req goes to, of those that can take it now; None: none can."""
        cands = []
        for g in groups:
            look = g.lookup(req)
            if g.can_take(req, look, self.cfg):
                cands.append(Candidate(g, look))
        return self._policy(req, cands) if cands else None

    @property
    def by_lane(self) -> bool:
        """Requests wait for the group they prefer (``prefer``), not for any group with room."""
        return self.cfg.routing_policy == "cache_aware"

    def prefer(self, req: GenerateReq, groups: Iterable[GroupState], lanes: Mapping[str, int]) -> Candidate | None:
        """cache_aware's group for req among those not draining whose pool could hold it alone,
        whether or not it can take req now; lanes: requests already waiting for each group.
        None: no group could."""
        alone = req.prompt_len + req.params.max_new_tokens
        cands = [Candidate(g, g.lookup(req)) for g in groups if not g.draining and g.capacity >= alone]
        if not cands:
            return None
        now = [c for c in cands if c.group.can_take(req, c.look, self.cfg)]
        fallback = least_loaded(now) if now else min(cands, key=lambda c: _queue_key(c, lanes))
        best = max(cands, key=lambda c: (c.matched, -_queue_key(c, lanes)[0]))
        if best.matched - fallback.matched < max(self.cfg.cache_aware_min_match * len(req.input_ids), 1):
            return fallback
        lightest = min(_queue_key(c, lanes)[0] for c in cands)
        if _queue_key(best, lanes)[0] - lightest > self.cfg.cache_aware_balance_margin:
            return fallback
        return best

    def is_hit(self, req: GenerateReq, matched: int) -> bool:
        """A placement that reuses a prefix worth routing for (the figures count these)."""
        return matched > 0 and matched >= self.cfg.cache_aware_min_match * len(req.input_ids)

    def _cache_aware(self, req: GenerateReq, cands: list[Candidate]) -> Candidate:
        fallback = least_loaded(cands)
        best = max(cands, key=lambda c: (c.matched, _load_key(c)))
        if best.matched - fallback.matched < max(self.cfg.cache_aware_min_match * len(req.input_ids), 1):
            return fallback
        lightest = min(len(c.group.placed) for c in cands)
        if len(best.group.placed) - lightest > self.cfg.cache_aware_balance_margin:
            return fallback
        return best

    def _round_robin(self, req: GenerateReq, cands: list[Candidate]) -> Candidate:
        ordered = sorted(cands, key=lambda c: c.group.name)
        chosen = next((c for c in ordered if c.group.name > self._last), ordered[0])
        self._last = chosen.group.name
        return chosen


def least_loaded(cands: list[Candidate]) -> Candidate:
    return max(cands, key=_load_key)  # the first of equals: the group that joined first


def _load_key(c: Candidate) -> tuple[int, int]:
    return c.group.headroom(), -len(c.group.placed)


def _queue_key(c: Candidate, lanes: Mapping[str, int]) -> tuple[int, int]:
    """Requests placed on the group and waiting in its lane (fewer first), then the most room."""
    return len(c.group.placed) + lanes.get(c.group.name, 0), -c.group.headroom()
