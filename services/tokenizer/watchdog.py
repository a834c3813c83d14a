"""The front end's view of who is alive, and the requests in flight that nothing alive will answer.

Every check the heartbeats are read once, on a connection with a short timeout and no retry,
so the read also says whether Redis itself answers:
- Redis unreachable: new requests are refused at once (503) and /health answers 503; once it
  has been away for dead_after_s, every request in flight ends with an error naming Redis.
- No worker group alive: every request in flight ends at once. A request's detokenizer shard
  gone: another shard (or the same one restarted) takes its stream over and beats in its name
  (services/detokenizer/adoption.py); with none doing so within DETOK_TAKEOVER_S, it ends.
- No visual replica alive: requests with images that have had no answer yet end (they wait in
  the visual stream, or are on their way to the router); one restarted sooner claims them.
- No router heartbeat for router_dead_after_s: requests that have had no answer yet (queued
  in the router's stream, or on their way there) end with an error. A router restarted sooner
  takes the queue over (it claims its predecessor's unacknowledged entries), so until then
  requests are still taken; those already running on a worker group need no router.
While Redis is away no heartbeat can be written, and those written before expire: for
dead_after_s after it answers again, the replicas seen before still count as alive.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from shared.heartbeat import live_replicas
from shared.messages import Heartbeat
from shared.redis_link import TRANSIENT, RedisLink
from shared.streams import SERVICE_DETOK, SERVICE_ROUTER, SERVICE_VISUAL, SERVICE_WORKER, StreamNames

log = logging.getLogger(__name__)

Beats = dict[str, Heartbeat]  # replica name -> its latest heartbeat

# a shard's death is seen within dead_after_s (3 s) of its last beat; its stream's owner key
# lapses 5 s after it (shared/stream_owner.py), another shard looks for such streams every second
# and beats for the one it takes, which front ends read every second: about 4 s after the death
# is seen; 8 s (the router's grace too) leaves a loaded machine, or a restart, a margin
DETOK_TAKEOVER_S = 8.0


@dataclass
class Liveness:
    workers: Beats = field(default_factory=dict)
    detoks: Beats = field(default_factory=dict)
    routers: Beats = field(default_factory=dict)
    visuals: Beats = field(default_factory=dict)  # a vision-language model's visual replicas
    redis: bool = True  # the last check reached Redis

    @property
    def ready(self) -> bool:
        return self.redis and bool(self.workers and self.detoks and self.routers)


class InFlight(Protocol):
    """What the watchdog reads of a request in flight (pipeline.PendingRequest)."""

    detok: str
    answered: bool
    images: bool


Req = TypeVar("Req", bound=InFlight)


class Watchdog:
    def __init__(self, link: RedisLink, names: StreamNames, dead_after_s: float, router_dead_after_s: float) -> None:
        self.link = link
        self.names = names
        self.dead_after_s = dead_after_s
        self.router_dead_after_s = router_dead_after_s
        self.live = Liveness()
        self.redis_down_since: float | None = None  # unix time of the first of the checks that failed in a row
        self._back_at = float("-inf")  # when Redis answered again after it was away
        self._routers: Beats = {}  # kept past their keys' expiry: the router's wait is longer
        self._detoks_gone: dict[str, float] = {}  # shard -> when its requests were first seen unserved

    def refresh(self, now: float) -> bool:
        """Read the heartbeats; -> whether Redis answered again after it was away."""
        try:
            services = (SERVICE_WORKER, SERVICE_DETOK, SERVICE_VISUAL)
            beats = {s: live_replicas(self.link, self.names, s, once=True) for s in services}
            routers = live_replicas(self.link, self.names, SERVICE_ROUTER, once=True)
        except TRANSIENT as e:
            if self.redis_down_since is None:
                self.redis_down_since = now
                log.error("redis is unreachable (%s: %s): refusing new requests", type(e).__name__, e)
            self.live = dataclasses.replace(self.live, redis=False)
            return False
        back = self.redis_down_since is not None
        if back:
            log.warning("redis answers again after %.1fs", now - self.redis_down_since)
            self.redis_down_since = None
            self._back_at = now
        grace = now - self._back_at < self.dead_after_s  # heartbeats could not be written while it was away
        self._routers = _fresh({**self._routers, **routers}, {}, self.router_dead_after_s, now, grace)
        before = self.live
        self.live = Liveness(
            workers=_fresh(beats[SERVICE_WORKER], before.workers, self.dead_after_s, now, grace),
            detoks=_fresh(beats[SERVICE_DETOK], before.detoks, self.dead_after_s, now, grace),
            routers=_fresh(self._routers, before.routers, self.router_dead_after_s, now, grace),
            visuals=_fresh(beats[SERVICE_VISUAL], before.visuals, self.dead_after_s, now, grace),
        )
        self._detoks_gone = {k: t for k, t in self._detoks_gone.items() if k not in self.live.detoks}
        return back

    def redis_lost(self, now: float) -> bool:
        """Redis has been unreachable for dead_after_s: requests in flight end, sends give up."""
        return self.redis_down_since is not None and now - self.redis_down_since >= self.dead_after_s

    def orphans(self, pending: Iterable[Req], now: float) -> list[tuple[Req, str]]:
        """The requests that nothing alive will answer, each with why."""
        if self.redis_lost(now):
            assert self.redis_down_since is not None
            why = f"redis is unreachable (for {now - self.redis_down_since:.0f}s)"
            return [(p, why) for p in pending]
        live = self.live
        if not live.redis:
            return []  # not for long yet: its requests may still be answered
        out: list[tuple[Req, str]] = []
        for p in pending:
            shard = live.detoks.get(p.detok)
            if not live.workers:
                out.append((p, "no worker is alive"))
            elif shard is None and now - self._detoks_gone.setdefault(p.detok, now) > DETOK_TAKEOVER_S:
                out.append((p, f"detokenizer {p.detok} died and no other shard took its requests over"))
            elif p.images and not p.answered and not live.visuals:
                out.append((p, "no visual replica is alive to encode the request's images"))
            elif not live.routers and not p.answered:
                out.append((p, f"the router is not alive (no heartbeat for {self.router_dead_after_s:g}s)"))
        return out


def _fresh(beats: Beats, before: Beats, dead_after_s: float, now: float, grace: bool) -> Beats:
    """The replicas that beat within dead_after_s; in the grace after Redis came back, every one
    whose key is there and every one seen before."""
    if grace:
        return {**before, **beats}
    return {name: hb for name, hb in beats.items() if now - hb.time <= dead_after_s}
