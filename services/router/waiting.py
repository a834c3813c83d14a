"""The router's global waiting queue, and the aborts that arrived before their request.

The queue is first in, first out: the head waits until some group can hold it, and
nothing overtakes it, so a large request is never starved by a stream of small ones. Under
cache_aware routing the order is kept per group (RouterCore._admit_by_lane), where a request
whose prefix the group's running requests hold may overtake, a bounded number of times.
Rids are indexed so that a duplicate delivery or an abort is found without a scan.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

from shared.messages import GenerateReq


class WaitingQueue:
    def __init__(self) -> None:
        self._order: deque[GenerateReq] = deque()
        self._by_rid: dict[str, GenerateReq] = {}

    def __len__(self) -> int:
        return len(self._by_rid)

    def __bool__(self) -> bool:
        return bool(self._by_rid)

    def __contains__(self, rid: str) -> bool:
        return rid in self._by_rid

    def __iter__(self) -> Iterator[GenerateReq]:
        return iter(self._order)

    def append(self, req: GenerateReq) -> None:
        self._order.append(req)
        self._by_rid[req.rid] = req

    def appendleft(self, req: GenerateReq) -> None:
        self._order.appendleft(req)
        self._by_rid[req.rid] = req

    def insert_by_arrival(self, req: GenerateReq) -> None:
        """Ahead of every request that arrived later: a request handed over from a dead group
        keeps its place in line."""
        at = next((i for i, r in enumerate(self._order) if r.arrival > req.arrival), len(self._order))
        self._order.insert(at, req)
        self._by_rid[req.rid] = req

    def head(self) -> GenerateReq:
        return self._order[0]

    def popleft(self) -> GenerateReq:
        req = self._order.popleft()
        del self._by_rid[req.rid]
        return req

    def remove(self, rid: str) -> GenerateReq | None:
        req = self._by_rid.pop(rid, None)
        if req is not None:
            self._order.remove(req)
        return req

    def take_if(self, pred: Callable[[GenerateReq], bool]) -> list[GenerateReq]:
        """Remove and return every request for which pred holds, in queue order."""
        taken = [r for r in self._order if pred(r)]
        if taken:
            self._order = deque(r for r in self._order if not pred(r))
            for r in taken:
                del self._by_rid[r.rid]
        return taken


class RecentAborts:
    """Aborts for rids the router does not hold, kept for a while.

    An abort can overtake its request: after a router restart the new router reads new
    entries at once but claims its predecessor's pending GenerateReqs only when the old
    consumer's lease expires, and it learns of running requests only from the next
    status. A remembered abort ends the request as soon as it shows up.
    """

    def __init__(self, ttl_s: float = 120.0, max_size: int = 100_000) -> None:
        self.ttl_s = ttl_s
        self.max_size = max_size
        self._until: OrderedDict[str, float] = OrderedDict()  # rid -> expiry, oldest first

    def __contains__(self, rid: str) -> bool:
        return rid in self._until

    def __len__(self) -> int:
        return len(self._until)

    def add(self, rid: str, now: float) -> None:
        self._until[rid] = now + self.ttl_s
        self._until.move_to_end(rid)
        while len(self._until) > self.max_size:
            self._until.popitem(last=False)

    def discard(self, rid: str) -> None:
        self._until.pop(rid, None)

    def prune(self, now: float) -> None:
        while self._until:
            rid, until = next(iter(self._until.items()))
            if until > now:
                return
            del self._until[rid]
