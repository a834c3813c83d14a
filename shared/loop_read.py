"""Polling a stream from an asyncio event loop, with no thread between Redis's answer and the loop.

The front end reads its replies while requests are in flight by polling (shared/busy_poll.py).
Through a thread, each entry then waits for the thread to wake from redis-py's recv and for
the loop to wake for the thread's hand-over: on the H200 host, 0.36 ms from the detokenizer's
send to the thread's read and 0.14 ms more to the loop (docs/benchmarks.md, r56). Here the
loop makes the polls itself, asynchronously: a poll's commands (the read's pipeline, packed
as RESP) are written to a connection of the loop's own, and the answer is parsed by hiredis
as it arrives. An empty answer sends the next poll from the same callback, so the coroutine
that waits is woken only by entries (or when its wait is over). Between answers the loop
serves everything else: unlike a blocking read on the loop (r43), a poll never holds up the
requests' own work by more than its callback.

A failure (the connection lost or refused, the group gone, an error answer, no answer in
ANSWER_TIMEOUT_S) makes ``read`` return None, and the caller reads through its thread, with
redis-py's retries and the group's re-creation, for RETRY_S before this way is tried again.
A poll whose answer was lost may have taken entries that nobody saw: they stay pending for
this consumer. Each poll is marked sent to the StreamReader until its answer is read, so the
next read, here or the thread's, recovers them (redis_streams.py). The first poll on each new
connection, once the acknowledgements it carries are applied, reads all this consumer's
pending entries (start "0"): the front end acknowledges every entry it is handed before its
next read, so those are the lost ones, and what a predecessor of the same name left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import hiredis

from shared.redis_streams import Entry, StreamReader
from shared.spin_read import hello, pack

log = logging.getLogger(__name__)

RETRY_S = 1.0  # after a failure, reads go through the caller's thread for this long
CONNECT_TIMEOUT_S = 0.5
ANSWER_TIMEOUT_S = 0.5  # a poll not answered in this long means Redis is stalled


class _Answers(asyncio.Protocol):
    """Hands each batch of ``expect`` answers to ``on_answers``, in order."""

    def __init__(self) -> None:
        self.parser = hiredis.Reader()
        self.expect = 0
        self.got: list[Any] = []
        self.on_answers: Any = None
        self.on_lost: Any = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        while (reply := self.parser.gets()) is not False:
            self.got.append(reply)
            if len(self.got) == self.expect and self.on_answers is not None:
                answers, self.got = self.got, []
                self.on_answers(answers)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.on_lost is not None:
            self.on_lost(exc or ConnectionResetError("Redis closed the connection"))


class LoopReader:
    """Non-blocking polls of one StreamReader's stream and group, made from the running loop."""

    def __init__(self, reader: StreamReader) -> None:
        self.reader = reader
        self._conn: _Answers | None = None
        self._retry_at = 0.0
        self._busy = False
        self._recover = True  # the next poll reads this consumer's pending entries first

    async def read(self, count: int, acks: list[Entry], wait_s: float) -> list[Entry] | None:
        """Entries (``acks`` acknowledged in the first poll's round trip), [] if none came within
        ``wait_s``, or None if this way cannot read now (the caller reads through its thread)."""
        if time.monotonic() < self._retry_at or self._busy:
            return None
        self._busy = True
        try:
            conn = self._conn if self._conn is not None and self._conn.transport is not None else await self._connect()
            start = "0" if self._recover else self.reader.start()
            answer = self._poll(conn, count, [e.entry_id for e in acks], wait_s, start)
            resp, start = await asyncio.wait_for(answer, wait_s + ANSWER_TIMEOUT_S)
            self._recover = False
        except asyncio.CancelledError:  # a poll may still be in flight: its answer must not be taken for the next's
            self.close()
            self._recover = True
            raise
        except (OSError, hiredis.ProtocolError, hiredis.ReplyError) as e:  # TimeoutError is an OSError
            log.warning(
                "the event loop's polls of %s failed (%s: %s); its thread reads for %.0f s",
                self.reader.stream,
                type(e).__name__,
                e,
                RETRY_S,
            )
            self.close()
            self._retry_at = time.monotonic() + RETRY_S
            self._recover = True
            return None
        finally:
            self._busy = False
        out = self.reader.entries_of(resp)
        self.reader.answered(start, count, len(out))
        return out

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None

    def _poll(self, conn: _Answers, count: int, ack_ids: list[bytes], wait_s: float, start: str) -> asyncio.Future[Any]:
        """Polls until one answers with entries or ``wait_s`` is over: the first from ``start``,
        the rest from where the reader says (new entries, unless a recovery poll came back
        full). The future gives the last answer and the start it read from. Each poll is
        marked sent to the reader until answered, so a poll whose answer is lost is recovered
        by whichever read comes next, this way or the thread's."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        end = loop.time() + wait_s
        sent_from = [start]

        def send(ids: list[bytes], start: str) -> None:
            commands = self.reader.read_commands(count, ids, None, start)
            conn.expect = len(commands)
            assert conn.transport is not None
            sent_from[0] = start
            self.reader.sent()
            conn.transport.write(pack(commands))

        def on_answers(answers: list[Any]) -> None:
            if done.done():
                return
            error = next((a for a in answers if isinstance(a, hiredis.ReplyError)), None)
            if error is not None:  # the group gone (NOGROUP) among them: the thread's read recreates it
                done.set_exception(error)
            elif any(entries for _stream, entries in answers[-1] or []) or loop.time() >= end:
                done.set_result((answers[-1], sent_from[0]))
            else:
                self.reader.answered(sent_from[0], count, 0)
                send([], self.reader.start())

        def on_lost(exc: Exception) -> None:
            if not done.done():
                done.set_exception(ConnectionResetError(str(exc)))

        conn.on_answers, conn.on_lost = on_answers, on_lost
        send(ack_ids, start)
        return done

    async def _connect(self) -> _Answers:
        loop = asyncio.get_running_loop()
        kw = self.reader.link.client.connection_pool.connection_kwargs
        conn = _Answers()
        if kw.get("path"):
            connect = loop.create_unix_connection(lambda: conn, kw["path"])
        else:
            connect = loop.create_connection(lambda: conn, kw.get("host", "localhost"), kw.get("port", 6379))
        await asyncio.wait_for(connect, CONNECT_TIMEOUT_S)
        self._conn = conn  # from here a failure closes it (read's handlers)
        if commands := hello(kw):
            answered: asyncio.Future[list[Any]] = loop.create_future()
            conn.expect = len(commands)
            conn.on_answers = lambda answers: answered.done() or answered.set_result(answers)
            assert conn.transport is not None
            conn.transport.write(pack(commands))
            for answer in await asyncio.wait_for(answered, CONNECT_TIMEOUT_S):
                if isinstance(answer, hiredis.ReplyError):
                    raise answer
        return conn
