"""Copies of the requests the router has placed, kept in Redis while they run.

The router hands a dead worker group's requests over from its own copy of each (docs/router.md,
Failures). A router that restarted learns the requests running on each group from the groups'
statuses, which carry no prompt: it reads their copies here instead, so it can hand them over
too. A copy is written with the admission that places its request (the same round trip), dropped
when a status shows the request ended, and expires with the request's deadline in any case.
"""

from __future__ import annotations

import time

from shared.messages import GenerateReq, WireError, decode
from shared.redis_link import RedisLink
from shared.streams import StreamNames

NO_DEADLINE_TTL_S = 3600.0  # a copy of a request without a deadline lasts this long


class RequestCopies:
    def __init__(self, link: RedisLink, names: StreamNames) -> None:
        self.link = link
        self.names = names

    def puts(self, reqs: list[GenerateReq]) -> list[tuple[str, GenerateReq, int]]:
        """What StreamWriter.send_many's ``put`` takes to keep copies of reqs."""
        now = time.time()
        out = []
        for req in reqs:
            ttl_s = req.deadline - now if req.deadline else NO_DEADLINE_TTL_S
            out.append((self.names.request_copy(req.rid), req, max(int(ttl_s * 1000), 1_000)))
        return out

    def keys(self, rids: list[str]) -> list[str]:
        """What send_many's ``drop`` takes to forget the copies of rids."""
        return [self.names.request_copy(rid) for rid in rids]

    def get(self, rids: list[str]) -> dict[str, GenerateReq]:
        """The copies found of rids."""
        if not rids:
            return {}
        values = self.link.call(lambda r: r.mget(self.keys(rids)))
        out = {}
        for rid, data in zip(rids, values, strict=True):
            try:
                req = decode(data) if data is not None else None
            except WireError:  # another schema version's: as good as none
                req = None
            if isinstance(req, GenerateReq):
                out[rid] = req
        return out
