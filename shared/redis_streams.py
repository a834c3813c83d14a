"""Redis stream helpers: the only code in LightStream that touches streams.

Writers append with ``XADD ... MAXLEN ~ N`` so no stream grows without bound, and readers
trim their stream by what every group has consumed once a second (shared/stream_trim.py). Readers
consume through a consumer group and acknowledge an entry only after its side effect
is done; a reader also claims the pending entries of a consumer that died (its lease,
refreshed by every read, expired), so a restarted service picks up where its predecessor
stopped. A group that vanished (Redis restarted without persistence, or a new master after a
Sentinel failover lacks it) is created again, and an acknowledgement sent to it is dropped.

A read whose answer is lost (the connection dropped or timed out after Redis ran it) has
made its entries this consumer's pending ones, and no later read of new entries returns
them. So after a read that was not answered, the reader's next read asks for its own
pending entries after the last one it has handed out (``XREADGROUP ... STREAMS s <id>``):
exactly what the lost answer held, since new entries come in id order, and never the
entries a consumer still holds unacknowledged (the router's queue). The rule is written once
(StreamReader's ``_start``, ``_commands`` and ``_answered``) and followed by both ways of
reading: ``read`` through redis-py, ``aread`` through redis.asyncio on an event loop.

A group hands entries out in id order, so a read of new entries never returns one at or below
the highest the reader has handed out, unless the group forgot its last deliveries: a replica
promoted by a Sentinel failover before the old master's last reads reached it. Those entries
are dropped (``_drop_seen``), not handed out twice; a group the reader made again starts over.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from shared.messages import WireError, decode, encode
from shared.redis_link import RedisLink, is_nogroup, maybe
from shared.stream_trim import trim_consumed
from shared.streams import consumer_lease

log = logging.getLogger(__name__)

FIELD = b"m"  # every entry holds one msgpack message under this field


@dataclass(frozen=True, slots=True)
class Entry:
    stream: str
    group: str
    entry_id: bytes
    msg: Any  # a decoded message from shared.messages


class StreamWriter:
    def __init__(self, link: RedisLink, maxlen: int = 100_000) -> None:
        self.link = link
        self.maxlen = maxlen

    def send(self, stream: str, msg: Any) -> None:
        data = encode(msg)
        self.link.call(lambda r: r.xadd(stream, {FIELD: data}, maxlen=self.maxlen, approximate=True))

    def send_many(
        self,
        items: Iterable[tuple[str, Any]],
        acks: Iterable[Entry] = (),
        once: bool = False,
        give_up: Callable[[], bool] | None = None,
        put: Iterable[tuple[str, str, Any]] = (),
        drop: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Append several messages in one round trip, each to its own stream, in order.

        Entries in ``acks`` are acknowledged in the same MULTI/EXEC transaction, so a
        consumer that dies mid-way has either done both (sent and acknowledged) or
        neither, and its successor neither loses nor repeats the work. With ``once``, one
        attempt that never blocks long (RedisLink.call_once): it raises where the default
        would wait for Redis with backoff; with ``give_up``, the wait ends (RedisUnreachable)
        when it says so. ``put`` (hash, field, message) and ``drop`` (hash, field) set and
        delete messages kept in hashes in the same round trip (shared/request_copies.py)."""
        encoded = [(stream, encode(msg)) for stream, msg in items]
        ack_list = list(acks)
        puts = [(key, name, encode(msg)) for key, name, msg in put]
        drops = list(drop)
        if not encoded and not ack_list and not puts and not drops:
            return

        def run(r: redis.Redis) -> None:
            pipe = r.pipeline(transaction=bool(ack_list) and bool(encoded))
            for stream, data in encoded:
                pipe.xadd(stream, {FIELD: data}, maxlen=self.maxlen, approximate=True)
            for (stream, group), ids in _by_group(ack_list).items():
                pipe.xack(stream, group, *ids)
            for key, name, data in puts:
                pipe.hset(key, name, data)
            for key, name in drops:
                pipe.hdel(key, name)
            for answer in pipe.execute(raise_on_error=False):
                # an acknowledgement to a group this Redis lacks (a new master after a failover, a
                # restart without persistence) is moot: the group holds nothing pending; the
                # messages are sent, so no retry (it would send them twice)
                if isinstance(answer, Exception) and not is_nogroup(answer):
                    raise answer

        if once:
            self.link.call_once(run)
        else:
            self.link.call(run, give_up=give_up)


def _id_key(entry_id: bytes | str) -> tuple[int, int]:
    """A stream entry id ("ms-seq") as a pair that orders as Redis orders ids."""
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


def _by_group(entries: list[Entry]) -> dict[tuple[str, str], list[bytes]]:
    out: dict[tuple[str, str], list[bytes]] = {}
    for e in entries:
        out.setdefault((e.stream, e.group), []).append(e.entry_id)
    return out


class StreamReader:
    """One consumer of one stream through a consumer group.

    ``read`` is one read through the link (redis-py, retried with backoff while Redis is
    away); ``aread`` is the same read through redis.asyncio, for an event loop. What a lost
    answer took is recovered whichever way the next read is made."""

    def __init__(
        self,
        link: RedisLink,
        stream: str,
        group: str,
        consumer: str,
        claim_idle_ms: int = 5_000,  # a consumer that has not read for this long is dead (its lease expires)
        claim_every_s: float = 1.0,
        trim_every_s: float = 1.0,  # how often the stream is trimmed by what has been consumed
    ) -> None:
        self.link = link
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.claim_idle_ms = claim_idle_ms
        self.claim_every_s = claim_every_s
        self.lease = consumer_lease(stream, group, consumer)
        self._next_claim = 0.0
        self.trim_every_s = trim_every_s
        self._next_trim = 0.0
        self._handed_out = (0, 0)  # the highest entry id this reader has returned (or dropped)
        self._unanswered = False  # a read was sent and its answer not read: the next one recovers
        self._async: aioredis.Redis | None = None  # aread's client, made on its first call
        self.ensure_group()

    def ensure_group(self) -> None:
        """Create the group (and stream) if missing; reading starts at the stream's beginning
        so that nothing sent before the first reader existed is lost."""

        def run(r: redis.Redis) -> None:
            try:
                r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
                return
            self._handed_out = (0, 0)  # a group made new hands the stream out again from its start

        self.link.call(run)

    def read(self, count: int = 256, block_ms: int | None = None, acks: Iterable[Entry] = ()) -> list[Entry]:
        """Entries claimed from dead consumers first, then new ones; waits up to block_ms
        (None: does not wait) when there is nothing. Entries in ``acks`` are acknowledged in
        the same round trip, ahead of the read."""
        acks = list(acks)
        if self._trim_due():
            self.link.call(lambda r: trim_consumed(r, self.stream))
        if claimed := self._claim_due():
            self.ack(acks)
            return claimed

        def run(r: redis.Redis) -> list[Entry]:
            ack_ids = [e.entry_id for e in acks]
            while True:
                start = self._start()
                pipe = r.pipeline(transaction=False)
                for command in self._commands(count, ack_ids, block_ms, start):
                    pipe.execute_command(*command)  # redis-py parses each answer by its command's name
                out = self._answered(start, count, pipe.execute()[-1])
                if out or start == ">":
                    return out
                ack_ids = []  # a recovery read that found nothing lost: now the read of new entries

        return self._call_group(run) or []

    async def aread(self, count: int = 256, block_ms: int | None = None, acks: Iterable[Entry] = ()) -> list[Entry]:
        """What ``read`` returns (without claiming: an event loop's stream has one consumer),
        through redis.asyncio: the loop serves its other tasks while Redis answers. A failure
        raises (redis.ConnectionError, redis.TimeoutError) for the caller to try again; the
        next read recovers what this one may have taken."""
        if self._async is None:
            self._async = self.link.target.async_client(socket_timeout=self.link.socket_timeout_s)
        ack_ids = [e.entry_id for e in acks]
        if self._trim_due():
            await trim_consumed(self._async, self.stream)
        while True:
            start = self._start()
            pipe = self._async.pipeline(transaction=False)
            for command in self._commands(count, ack_ids, block_ms, start):
                pipe.execute_command(*command)
            try:
                answers = await pipe.execute()
            except redis.ResponseError as e:  # the group gone (Redis restarted): made again, read again
                if not is_nogroup(e):
                    raise
                self.ensure_group()
                continue
            out = self._answered(start, count, answers[-1])
            if out or start == ">":
                return out
            ack_ids = []

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
        self._async = None

    def _trim_due(self) -> bool:
        """Whether this read trims the stream first (shared/stream_trim.py): once a trim_every_s."""
        now = time.monotonic()
        if now < self._next_trim:
            return False
        self._next_trim = now + self.trim_every_s
        return True

    def _start(self) -> str:
        """Where the next read starts: ">" (new entries), or after a read that was not answered,
        just past the last entry handed out (this consumer's pending entries that came later).
        Marks a read as sent: until ``_answered``, the next read must recover what it takes."""
        start = f"{self._handed_out[0]}-{self._handed_out[1]}" if self._unanswered else ">"
        self._unanswered = True
        return start

    def _commands(self, count: int, ack_ids: list[bytes], block_ms: int | None, start: str) -> list[tuple[Any, ...]]:
        """One read's pipeline: the lease ("still alive"), the acknowledgements, the read (of new
        entries, or with ``start`` an id, of this consumer's own pending ones after it, never
        blocking: there is no waiting for what Redis already holds)."""
        commands: list[tuple[Any, ...]] = [("SET", self.lease, b"1", "PX", self.claim_idle_ms)]
        if ack_ids:
            commands.append(("XACK", self.stream, self.group, *ack_ids))
        block = ("BLOCK", block_ms) if block_ms is not None and start == ">" else ()
        commands.append(
            ("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count, *block, "STREAMS", self.stream, start)
        )
        return commands

    def _answered(self, start: str, count: int, answer: Any) -> list[Entry]:
        """The entries of a read from ``start``, now handed out. A recovery read that came back
        full may have left more behind, so the next read recovers too."""
        taken = [e for _stream, entries in answer or [] for e in entries]
        self._unanswered = start != ">" and len(taken) >= count
        if start == ">":
            taken = self._drop_seen(taken)
        return self._decode_entries(taken)

    def _drop_seen(self, taken: list[Any]) -> list[Any]:
        """A read of new entries less those this reader has handed out already (the module's
        docstring: a failover's lagging group), which are acknowledged: the reader still holds
        what it has not finished, and the promoted group lost the acknowledgements made after
        its copy, so they would stay pending for good."""
        seen = [entry_id for entry_id, _fields in taken if _id_key(entry_id) <= self._handed_out]
        if not seen:
            return taken
        log.warning(
            "%s on %s: %d entries handed out before came again (a failover's lagging group); acknowledged",
            self.group,
            self.stream,
            len(seen),
        )
        self._call_group(lambda r: r.xack(self.stream, self.group, *seen))
        return [(entry_id, fields) for entry_id, fields in taken if _id_key(entry_id) > self._handed_out]

    def release(self) -> None:
        """On a clean exit: give up the lease now, so another consumer of the group claims what
        this one leaves pending at its next claim instead of after the lease's expiry. Best
        effort: Redis away, the lease expires by itself."""
        with contextlib.suppress(Exception):
            self.link.call_once(lambda r: r.delete(self.lease))

    def ack(self, entries: Iterable[Entry]) -> None:
        ids = [e.entry_id for e in entries]
        if ids:
            self._call_group(lambda r: r.xack(self.stream, self.group, *ids))

    def has_work(self) -> bool:
        """Whether the group has entries pending or not handed out yet."""
        groups = self._call_group(lambda r: r.xinfo_groups(self.stream)) or []
        group = next((g for g in groups if maybe(g["name"]) == self.group), None)
        if group is None:
            return False
        if int(group.get("pending", 0)):
            return True
        last = self.link.call(lambda r: r.xinfo_stream(self.stream))["last-generated-id"]
        return _id_key(group["last-delivered-id"]) < _id_key(last)

    def pending_count(self) -> int:
        info = self._call_group(lambda r: r.xpending(self.stream, self.group))
        return int(info["pending"]) if info else 0

    def _claim_due(self) -> list[Entry]:
        """Take over what consumers that stopped reading left pending, then forget them."""
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + self.claim_every_s
        consumers = self._call_group(lambda r: r.xinfo_consumers(self.stream, self.group)) or []
        claimed: list[Entry] = []
        for c in consumers:
            name = maybe(c.get("name"))
            if name == self.consumer or self._alive(name):
                continue
            if int(c.get("pending", 0)):
                claimed.extend(self._claim_from(name))
            self._call_group(lambda r, n=name: r.xgroup_delconsumer(self.stream, self.group, n))
        if claimed:
            log.warning("claimed %d pending entries of a dead consumer on %s", len(claimed), self.stream)
        return claimed

    def _alive(self, consumer: str) -> bool:
        return bool(self.link.call(lambda r: r.exists(consumer_lease(self.stream, self.group, consumer))))

    def take_over(self) -> tuple[list[Entry], list[Entry]]:
        """The stream's previous reader is gone (its owner key lost: shared/stream_owner.py):
        every entry pending in the group, whoever it was handed to, is made this consumer's.
        -> (those entries, and the acknowledged ones from the oldest of them to the last the
        group was handed out: what the previous reader did with its state, to be done again)."""
        pending = self._call_group(
            lambda r: r.xpending_range(self.stream, self.group, min="-", max="+", count=1_000_000)
        )
        ids = [p["message_id"] for p in pending or []]
        if not ids:
            return [], []
        claim = self._call_group(
            lambda r: r.xclaim(self.stream, self.group, self.consumer, min_idle_time=0, message_ids=ids)
        )
        taken = self._decode_entries(claim or [])
        groups = self._call_group(lambda r: r.xinfo_groups(self.stream)) or []
        last = next(maybe(g["last-delivered-id"]) for g in groups if maybe(g["name"]) == self.group)
        held = {maybe(i) for i in ids}
        raw = self._call_group(lambda r: r.xrange(self.stream, min=maybe(ids[0]), max=last)) or []
        done = self._decode_entries([(i, f) for i, f in raw if maybe(i) not in held])
        return taken, done

    def _claim_from(self, consumer: str) -> list[Entry]:
        """The dead consumer's pending entries, made this one's. The ids are read first and the
        XCLAIM retried with the same ids: a claim whose answer was lost has already moved the
        entries here, where asking the dead consumer again would find none, and claiming an
        entry this consumer owns gives it again."""
        pending = self._call_group(
            lambda r: r.xpending_range(self.stream, self.group, min="-", max="+", count=10_000, consumername=consumer)
        )
        ids = [p["message_id"] for p in pending or []]
        if not ids:
            return []
        claim = self._call_group(
            lambda r: r.xclaim(self.stream, self.group, self.consumer, min_idle_time=0, message_ids=ids)
        )
        return self._decode_entries(claim or [])

    def _decode_entries(self, entries: Any) -> list[Entry]:
        """Decoded entries, each now handed out; the undecodable are acknowledged and dropped."""
        out: list[Entry] = []
        bad: list[bytes] = []
        for entry_id, fields in entries:
            self._handed_out = max(self._handed_out, _id_key(entry_id))
            if fields is None:  # deleted by MAXLEN trimming while pending
                bad.append(entry_id)
                continue
            try:
                out.append(Entry(self.stream, self.group, entry_id, decode(fields[FIELD])))
            except (WireError, KeyError) as e:
                log.error("dropping undecodable entry %s on %s: %s", maybe(entry_id), self.stream, e)
                bad.append(entry_id)
        if bad:
            self._call_group(lambda r: r.xack(self.stream, self.group, *bad))
        return out

    def _call_group(self, fn: Any) -> Any:
        """Run a group command, recreating the group once if Redis lost it."""
        try:
            return self.link.call(fn)
        except redis.ResponseError as e:
            if not is_nogroup(e):
                raise
            log.warning("consumer group %s on %s is gone (redis restarted?); recreating", self.group, self.stream)
            self.ensure_group()
            return self.link.call(fn)
