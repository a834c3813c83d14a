"""Copies of the requests the router has placed, per worker group, kept in Redis while they run.

The router hands a dead worker group's requests over from its own copy of each (docs/router.md,
Failures). A router that restarted has none: it learns what each group runs from the group's
statuses, which carry no prompt, and never hears of a group instance that died before it
started. So each placement is also kept in a hash per group (field: the request id; value: an
AdmitReqs of that one request, naming the instance and admission it went with), written with
the admission (the same round trip) and deleted when the request ends there or leaves the
group. A router reads a group's hash when it first hears of the group: requests its status
lists get their copies, and those placed on an instance that is gone are handed over.
"""

from __future__ import annotations

from shared.messages import AdmitReqs, GenerateReq, WireError, decode
from shared.redis_link import RedisLink, maybe
from shared.streams import StreamNames


class RequestCopies:
    def __init__(self, link: RedisLink, names: StreamNames) -> None:
        self.link = link
        self.names = names

    def puts(self, admits: dict[tuple[str, str], list[GenerateReq]], seqs: dict[tuple[str, str], int]) -> list:
        """What StreamWriter.send_many's ``put`` takes to keep copies of a round's admissions."""
        return [
            (self.names.placed(group), req.rid, AdmitReqs(instance, seqs[(group, instance)], [req]))
            for (group, instance), reqs in admits.items()
            for req in reqs
        ]

    def drops(self, gone: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """What send_many's ``drop`` takes to forget copies: (group, rid) pairs."""
        return [(self.names.placed(group), rid) for group, rid in gone]

    def of_group(self, group: str) -> dict[str, AdmitReqs]:
        """Every copy kept for a group."""
        raw = self.link.call(lambda r: r.hgetall(self.names.placed(group)))
        return {maybe(rid): admit for rid, data in raw.items() if (admit := _decode(data)) is not None}

    def get(self, group: str, rids: list[str]) -> dict[str, GenerateReq]:
        """The copies found of some of a group's requests."""
        values = self.link.call(lambda r: r.hmget(self.names.placed(group), rids)) if rids else []
        return {rid: admit.reqs[0] for rid, data in zip(rids, values, strict=True) if (admit := _decode(data))}


def _decode(data: bytes | None) -> AdmitReqs | None:
    try:
        msg = decode(data) if data is not None else None
    except WireError:  # another schema version's: as good as none
        return None
    return msg if isinstance(msg, AdmitReqs) and len(msg.reqs) == 1 else None
