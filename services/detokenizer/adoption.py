"""Shard streams this detokenizer reads: its own, and those of dead shards it has taken over.

A shard's requests live in the process that read their registrations, and their tokens keep
coming to the shard's stream, so one process at a time reads it: the one that holds its owner
key (shared/stream_owner.py). A shard that dies stops refreshing the key; a live one that finds
a shard stream with no owner and something in it takes it over (StreamReader.take_over: the
registrations of the requests still open are pending there, the tokens their clients were sent
acknowledged after them), reads it until those requests have ended, and meanwhile beats in the
dead shard's name, marked draining, so front ends keep waiting for its requests and send it no
new ones. A shard that restarts waits for its stream to be free, then takes it over the same way.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from shared.heartbeat import HeartbeatPublisher
from shared.redis_link import RedisLink
from shared.redis_streams import StreamReader
from shared.stream_owner import StreamOwner, shard_streams
from shared.streams import GROUP_DETOK, SERVICE_DETOK, StreamNames

log = logging.getLogger(__name__)

HOLD_EVERY_S = 0.5  # the owner key is refreshed this often (it lasts StreamOwner.ttl_ms)
LOOK_EVERY_S = 1.0  # shard streams with no owner are looked for this often
# after Redis was away, every owner key may have lapsed meanwhile: the live shards take their
# own back before any looks for others'
AFTER_OUTAGE_S = 5.0


@dataclass
class ShardStream:
    shard: str
    reader: StreamReader
    owner: StreamOwner
    beat: HeartbeatPublisher | None = None  # in the dead shard's name, while taken over


class Adoptions:
    def __init__(self, link: RedisLink, names: StreamNames, me: str) -> None:
        self.link = link
        self.names = names
        self.me = me
        self.taken: dict[str, ShardStream] = {}  # dead shard -> its stream, read here
        self._next_look = 0.0
        self._next_hold = 0.0
        self._next_give_back = 0.0

    def stream(self, shard: str) -> ShardStream:
        stream = self.names.detok(shard)
        reader = StreamReader(self.link, stream, GROUP_DETOK, consumer=self.me)
        return ShardStream(shard, reader, StreamOwner(self.link, stream, self.me))

    def look(self, own: ShardStream) -> tuple[bool, list[ShardStream]]:
        """Keep the streams held (-> False when our own was lost) and take over those of dead
        shards that hold something: -> the streams newly taken."""
        now = time.monotonic()
        if now >= self._next_hold:
            self._next_hold = now + HOLD_EVERY_S
            if not own.owner.hold():
                return False, []
            for s in list(self.taken.values()):
                if not s.owner.hold():
                    log.error("lost shard %s's stream to %s", s.shard, s.owner.holder())
                    self._drop(s)
                elif s.beat is not None:
                    s.beat.beat()
        if now < self._next_look or now - self.link.recovered_at < AFTER_OUTAGE_S:
            return True, []
        self._next_look = now + LOOK_EVERY_S
        new = []
        for stream in shard_streams(self.link, self.names):
            shard = stream[len(self.names.detok("")) :]
            if shard == own.shard or shard in self.taken or StreamOwner(self.link, stream, self.me).holder():
                continue
            s = self.stream(shard)
            if not s.reader.has_work() or not s.owner.hold():
                continue
            log.warning("shard %s is gone: taking its stream over", shard)
            s.beat = HeartbeatPublisher(
                self.link, self.names, SERVICE_DETOK, shard, info=lambda: {"draining": 1.0, "taken_over": 1.0}
            )
            s.beat.beat()
            self.taken[shard] = s
            new.append(s)
        return True, new

    def give_back(self, open_by_shard: dict[str, int]) -> None:
        """Streams taken over whose requests have all ended, with nothing more in them, are let go
        (looked at once a LOOK_EVERY_S)."""
        now = time.monotonic()
        if now < self._next_give_back:
            return
        self._next_give_back = now + LOOK_EVERY_S
        for s in list(self.taken.values()):
            if not open_by_shard.get(s.shard) and not s.reader.has_work():
                log.info("shard %s's requests have ended: its stream let go", s.shard)
                s.owner.release()
                self._drop(s)

    def release_all(self) -> None:
        for s in list(self.taken.values()):
            s.owner.release()
            self._drop(s)

    def _drop(self, s: ShardStream) -> None:
        if s.beat is not None:
            s.beat.stop()
        del self.taken[s.shard]
