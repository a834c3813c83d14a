"""A Redis connection that waits for its answers without sleeping, for reads that poll.

A reader that polls (shared/busy_poll.py) makes one round trip after another, and through
redis-py each one sleeps in recv while Redis answers. On a host whose idle CPUs halt, the
wake after that sleep is most of the round trip: a PING took 0.048 ms through redis-py on
the H200 host and 0.019 ms read in a loop on a non-blocking socket
(tools/diag/wake_cost.py). The shorter the round trip, the sooner after an entry lands a
poll comes back with it. So a service whose polling thread is the only one that needs the
interpreter (the router's, the detokenizer's and the worker's loops) sends its polling
reads here: the commands packed as RESP, written in one send, the answers read in a loop
that never sleeps and parsed by hiredis. A thread that shares the interpreter with an event
loop must not do this: its loop would get the interpreter only between the polls' reads.

Only reads that do not block come here; a connection error raises redis.ConnectionError
and closes the connection (the caller goes back to redis-py, with its retries), and an
answer that is an error raises redis.ResponseError.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import hiredis
import redis

Arg = str | bytes | int


def pack(commands: list[tuple[Arg, ...]]) -> bytes:
    """The commands as RESP arrays of bulk strings, one after another (a pipeline)."""
    out = bytearray()
    for args in commands:
        out += b"*%d\r\n" % len(args)
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(b), b)
    return bytes(out)


def hello(connection_kwargs: dict[str, Any]) -> list[tuple[Arg, ...]]:
    """What a new connection sends first for redis-py's connection settings: AUTH, SELECT."""
    kw = connection_kwargs
    out: list[tuple[Arg, ...]] = []
    if kw.get("password"):
        out.append(("AUTH", *((kw["username"], kw["password"]) if kw.get("username") else (kw["password"],))))
    if kw.get("db"):
        out.append(("SELECT", kw["db"]))
    return out


class SpinConnection:
    def __init__(
        self, connection_kwargs: dict[str, Any], timeout_s: float = 10.0, connect_timeout_s: float = 0.5
    ) -> None:
        """``connection_kwargs``: redis-py's for the link's pool (host, port or path, db,
        username, password). ``timeout_s``: the longest wait for an answer."""
        self.kw = connection_kwargs
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._sock: socket.socket | None = None
        self._reader = hiredis.Reader()

    def execute(self, commands: list[tuple[Arg, ...]], timeout_s: float | None = None) -> list[Any]:
        """Each command's answer, in order, waited for up to ``timeout_s`` (None: the
        connection's own)."""
        sock = self._sock or self._connect()
        try:
            sock.sendall(pack(commands))
            return self._answers(sock, len(commands), self.timeout_s if timeout_s is None else timeout_s)
        except OSError as e:
            self.close()
            raise redis.ConnectionError(f"spinning read: {e}") from e

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._reader = hiredis.Reader()

    def _answers(self, sock: socket.socket, n: int, timeout_s: float) -> list[Any]:
        out: list[Any] = []
        reader = self._reader
        deadline = 0.0
        while len(out) < n:
            reply = reader.gets()
            if reply is not False:
                out.append(reply)
                continue
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                now = time.monotonic()
                if not deadline:
                    deadline = now + timeout_s
                elif now > deadline:
                    raise TimeoutError(f"no answer from Redis in {timeout_s} s") from None
                continue
            if not data:
                raise ConnectionResetError("Redis closed the connection")
            reader.feed(data)
        for reply in out:
            if isinstance(reply, hiredis.ReplyError):
                raise redis.ResponseError(str(reply))
        return out

    def _connect(self) -> socket.socket:
        kw = self.kw
        try:
            if kw.get("path"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.connect_timeout_s)
                sock.connect(kw["path"])
            else:
                address = (kw.get("host", "localhost"), kw.get("port", 6379))
                sock = socket.create_connection(address, self.connect_timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            raise redis.ConnectionError(f"spinning read: cannot connect: {e}") from e
        sock.setblocking(False)
        self._sock = sock
        if commands := hello(kw):
            try:
                self.execute(commands)
            except redis.ResponseError:
                self.close()
                raise
        return sock
