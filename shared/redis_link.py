"""A service's connection to Redis that survives Redis going away.

Every Redis call in LightStream goes through ``RedisLink.call``: on a connection error it
waits with exponential backoff and tries again until Redis answers or the service is
stopping, so a Redis restart costs a pause, not a crash.

The Redis is one address (``--redis-url``) or the master that Redis Sentinel names
(``--redis-sentinel``, ``--redis-master-name``): redis-py's Sentinel client asks the sentinels
for the master's address on every new connection, and a connection to a master that died or
was demoted to a replica fails (READONLY is made a connection error), so the same retry that
rides out a restart lands on the new master after a failover.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.connection import SSLConnection, parse_url
from redis.retry import Retry

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, ConnectionError, OSError)


class Stopping(Exception):
    """Raised out of a retry loop when the service is shutting down."""


class NotAtOnce(Exception):
    """call_once could not reach Redis at once: try again with call, where blocking is fine."""


class RedisUnreachable(Exception):
    """A call gave up waiting for Redis (its give_up said so): Redis has been away too long."""


def client(url: str, **options: Any) -> redis.Redis:
    """A redis-py client for url that tries each command once. Retrying is RedisLink's (call,
    with its backoff and its stop event), and call_once must fail at once. redis-py's own
    retries, which its plain constructor turns on in recent versions (ten tries with backoff up
    to a second: about 4 s against a closed port), would hide an outage inside one call."""
    return redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **options)


def async_client(url: str, **options: Any) -> aioredis.Redis:
    """A redis.asyncio client for url that tries each command once, as ``client``: its caller
    decides when to try again."""
    return aioredis.Redis.from_url(url, retry=AsyncRetry(NoBackoff(), 0), **options)


# how long a question to one sentinel may take: a dead sentinel costs this, then the next is asked
SENTINEL_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class RedisTarget:
    """Where the stack's Redis is: a URL, or the master a set of sentinels names. With
    sentinels, the URL gives the database, user, password and TLS (rediss://) only."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = ""
    sentinel_password: str = field(default="", repr=False)  # the sentinels' requirepass, if they have one

    @classmethod
    def of(cls, cfg: Any) -> RedisTarget:
        """From a service's config (shared/config.py CommonConfig)."""
        if not cfg.sentinel_addresses:
            return cls(cfg.redis_url)
        return cls(cfg.redis_url, cfg.sentinel_addresses, cfg.redis_master_name, cfg.redis_sentinel_password)

    def __str__(self) -> str:
        if not self.sentinels:
            return self.url
        return f"the master {self.master_name!r} of sentinels " + ",".join(f"{h}:{p}" for h, p in self.sentinels)

    def client(self, **options: Any) -> redis.Redis:
        """A redis-py client that tries each command once (see ``client``)."""
        if not self.sentinels:
            return client(self.url, **options)
        sentinel = redis.sentinel.Sentinel(self.sentinels, sentinel_kwargs=self._sentinel_options())
        return sentinel.master_for(self.master_name, retry=Retry(NoBackoff(), 0), **self._master_options(), **options)

    def async_client(self, **options: Any) -> aioredis.Redis:
        """A redis.asyncio client that tries each command once (see ``async_client``)."""
        if not self.sentinels:
            return async_client(self.url, **options)
        sentinel = aiosentinel.Sentinel(self.sentinels, sentinel_kwargs=self._sentinel_options())
        return sentinel.master_for(
            self.master_name, retry=AsyncRetry(NoBackoff(), 0), **self._master_options(), **options
        )

    def _master_options(self) -> dict[str, Any]:
        """The URL's database, credentials and TLS, without its host (the sentinels name it)."""
        parsed = parse_url(self.url)
        out = {k: v for k, v in parsed.items() if k in ("db", "username", "password")}
        if parsed.get("connection_class") is SSLConnection:
            out["ssl"] = True
        return out

    def _sentinel_options(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "socket_timeout": SENTINEL_TIMEOUT_S,
            "socket_connect_timeout": SENTINEL_TIMEOUT_S,
            "retry": Retry(NoBackoff(), 0),
        }
        return out | ({"password": self.sentinel_password} if self.sentinel_password else {})

    @staticmethod
    def master_address(r: redis.Redis) -> str:
        """The address a client of ``client`` last found the master at ("" before any)."""
        pool = r.connection_pool
        if isinstance(pool, redis.sentinel.SentinelConnectionPool) and pool.master_address:
            host, port = pool.master_address
            return f"{host}:{port}"
        return ""


class RedisLink:
    def __init__(
        self,
        url: str | RedisTarget,
        stop: threading.Event | None = None,
        max_backoff_s: float = 1.0,
        socket_timeout_s: float = 10.0,
        quick_timeout_s: float = 0.5,
        check_timeout_s: float = 2.0,
    ) -> None:
        self.target = url if isinstance(url, RedisTarget) else RedisTarget(url)
        self.stop = stop or threading.Event()
        self.max_backoff_s = max_backoff_s
        self.socket_timeout_s = socket_timeout_s
        self.quick_timeout_s = quick_timeout_s
        self.client = self.target.client(
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=2.0,
            socket_keepalive=True,
            retry_on_timeout=False,
            decode_responses=False,
        )
        # for call_once: a caller that must not block long (an event loop) tries once on a
        # connection of its own with a short timeout, and falls back to call from a thread
        self.quick = self.target.client(
            socket_timeout=quick_timeout_s, socket_connect_timeout=quick_timeout_s, decode_responses=False
        )
        # for try_call: a check that must learn within a bounded time whether Redis answers
        self.checks = self.target.client(
            socket_timeout=check_timeout_s, socket_connect_timeout=check_timeout_s, decode_responses=False
        )
        self._outage_since: float | None = None
        # monotonic time the last outage ended (0.0: none yet). Nobody's heartbeat or status could
        # land while Redis was away (a restart, a Sentinel failover), so the silence up to here
        # is Redis's, not the other services': the front end and the router excuse it
        self.recovered_at = 0.0
        self._lock = threading.Lock()

    def call(
        self,
        fn: Callable[[redis.Redis], T],
        on_reconnect: Callable[[], None] | None = None,
        give_up: Callable[[], bool] | None = None,
    ) -> T:
        """Run ``fn(client)``, retrying through connection errors with backoff; with ``give_up``,
        raise RedisUnreachable after a failed try when it says so."""
        delay = 0.05
        while True:
            try:
                result = fn(self.client)
            except TRANSIENT as e:
                self._note_outage(e)
                if give_up is not None and give_up():
                    raise RedisUnreachable(str(e)) from e
                if self.stop.wait(delay):
                    raise Stopping() from e
                delay = min(delay * 2, self.max_backoff_s)
                if on_reconnect is not None:
                    with contextlib.suppress(TRANSIENT):
                        on_reconnect()
                continue
            self._note_recovery()
            return result

    @property
    def in_outage(self) -> bool:
        """Redis was last found unreachable (a call_once now raises NotAtOnce at once)."""
        return self._outage_since is not None

    def call_once(self, fn: Callable[[redis.Redis], T]) -> T:
        """Run ``fn`` once on the quick connection, never waiting long. A connection error or
        timeout raises NotAtOnce, for the caller to fall back to ``call`` off its event loop;
        so does any call while an outage is known."""
        if self.in_outage:
            raise NotAtOnce("redis is unreachable")
        try:
            return fn(self.quick)
        except TRANSIENT as e:
            self._note_outage(e)
            raise NotAtOnce(str(e)) from e

    def try_call(self, fn: Callable[[redis.Redis], T]) -> T:
        """Run ``fn`` once on the checks connection, whose timeout is short: a connection error or
        timeout is raised (a TRANSIENT error) for the caller to learn that Redis is away."""
        try:
            result = fn(self.checks)
        except TRANSIENT as e:
            self._note_outage(e)
            raise
        self._note_recovery()
        return result

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except TRANSIENT:
            return False

    def close(self) -> None:
        self.client.close()
        self.quick.close()
        self.checks.close()

    def _note_outage(self, err: BaseException) -> None:
        with self._lock:
            if self._outage_since is None:
                self._outage_since = time.monotonic()
                log.warning("redis unreachable at %s (%s); retrying with backoff", self.target, err)

    def _note_recovery(self) -> None:
        if self._outage_since is None:
            return
        with self._lock:
            if self._outage_since is not None:
                at = self.target.master_address(self.client)
                where = f" (master {at})" if at else ""
                self.recovered_at = time.monotonic()
                log.warning("redis back after %.1fs%s", self.recovered_at - self._outage_since, where)
                self._outage_since = None


def is_nogroup(err: Exception) -> bool:
    return isinstance(err, redis.ResponseError) and "NOGROUP" in str(err)


def maybe(value: Any) -> Any:
    """Decode Redis bytes to str, leaving other values alone."""
    return value.decode() if isinstance(value, bytes) else value
