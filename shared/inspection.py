"""Read-only views of a running LightStream's Redis state, for ``python -m tools.inspect``.

Nothing here writes, acknowledges or joins a consumer group, so inspecting a live stack
never changes what it does. Heartbeats are read with shared/heartbeat.py's
``live_replicas``; the rest is here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from shared.messages import WireError, WorkerStatus, decode
from shared.redis_link import RedisLink, maybe
from shared.redis_streams import FIELD
from shared.streams import StreamNames

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupView:
    """One consumer group of a stream."""

    name: str
    consumers: int
    pending: int  # delivered to a consumer and not acknowledged yet
    lag: int | None  # entries not delivered yet (None: Redis cannot tell, e.g. after trimming)
    last_delivered: str


@dataclass(frozen=True)
class StreamView:
    name: str
    length: int
    groups: tuple[GroupView, ...]


def stream_views(link: RedisLink, names: StreamNames) -> list[StreamView]:
    """Every stream of the namespace with its length and consumer groups, by name."""

    def run(r: redis.Redis) -> list[StreamView]:
        keys = sorted(maybe(k) for k in r.scan_iter(match=names.stream_pattern(), count=500, _type="STREAM"))
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.xlen(key)
            pipe.xinfo_groups(key)
        replies = pipe.execute(raise_on_error=False)
        out = []
        for i, key in enumerate(keys):
            length, groups = replies[2 * i], replies[2 * i + 1]
            if isinstance(length, Exception) or isinstance(groups, Exception):
                continue  # deleted between the scan and the read
            out.append(StreamView(key, int(length), tuple(_group(g) for g in groups)))
        return out

    return link.call(run)


def _group(info: dict) -> GroupView:
    lag = info.get("lag")
    return GroupView(
        name=maybe(info["name"]),
        consumers=int(info.get("consumers", 0)),
        pending=int(info.get("pending", 0)),
        lag=None if lag is None else int(lag),
        last_delivered=maybe(info.get("last-delivered-id", b"")),
    )


def latest_worker_statuses(link: RedisLink, names: StreamNames, scan: int = 2000) -> dict[str, WorkerStatus]:
    """Each worker group's newest WorkerStatus among the router stream's last ``scan`` entries.

    The router acknowledges statuses but leaves them in its stream until MAXLEN trims them,
    so the tail of the stream holds what every live group reported last (a group sends one
    at least every status interval, half a second by default)."""

    def run(r: redis.Redis) -> list:
        return r.xrevrange(names.router, count=scan)

    out: dict[str, WorkerStatus] = {}
    for entry_id, fields in link.call(run):
        data = fields.get(FIELD)
        if data is None:
            continue
        try:
            msg = decode(data)
        except WireError:
            log.warning("skipping an undecodable entry %s of %s", maybe(entry_id), names.router)
            continue
        if isinstance(msg, WorkerStatus) and msg.group not in out:
            out[msg.group] = msg
    return out
