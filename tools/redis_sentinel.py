"""A Redis master, its replica and Redis Sentinels on free local ports (for the failover tests).

The sentinels are redis-server in sentinel mode (``redis-server FILE --sentinel``, what Debian's
redis-sentinel runs), each with a configuration file of its own that it rewrites as it learns.
They declare the master down after ``down_after_ms`` without an answer and promote the replica.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import redis

from tools.redis_server import RedisServer, free_port

MASTER_NAME = "lsmaster"


class SentinelSet:
    def __init__(
        self, sentinels: int = 3, down_after_ms: int = 1000, failover_timeout_ms: int = 5000, password: str = ""
    ) -> None:
        """password: the sentinels' own requirepass (none: they ask for none)."""
        self.master = RedisServer()
        self.replica = RedisServer(replicaof=self.master.port)
        self.ports = [free_port() for _ in range(sentinels)]
        self.quorum = sentinels // 2 + 1
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.dir = tempfile.mkdtemp(prefix="lightstream-sentinel-")
        self.procs: list[subprocess.Popen] = []
        self.password = password

    @property
    def addresses(self) -> str:
        """The --redis-sentinel value."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, timeout_s: float = 15.0) -> SentinelSet:
        self.master.start()
        self.replica.start()
        for port in self.ports:
            conf = os.path.join(self.dir, f"sentinel-{port}.conf")
            with open(conf, "w") as f:
                f.write(self._config(port))
            binary = shutil.which("redis-server") or "redis-server"
            self.procs.append(subprocess.Popen([binary, conf, "--sentinel"], stdout=subprocess.DEVNULL))
        end = time.monotonic() + timeout_s
        while not (self._replica_synced() and self._sentinels_see_replica()):
            if time.monotonic() > end:
                raise RuntimeError("the sentinels did not come up with the master and its replica in time")
            time.sleep(0.1)
        return self

    def _config(self, port: int) -> str:
        return "\n".join(
            [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self.dir}",
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} {self.quorum}",
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {MASTER_NAME} 1",
                *([f"requirepass {self.password}"] if self.password else []),
                "",
            ]
        )

    def _replica_synced(self) -> bool:
        try:
            info = redis.Redis(port=self.replica.port, socket_timeout=1).info("replication")
        except redis.RedisError:
            return False
        return info.get("master_link_status") == "up"

    def _sentinels_see_replica(self) -> bool:
        for port in self.ports:
            try:
                if not self._sentinel(port).sentinel_slaves(MASTER_NAME):
                    return False
            except redis.RedisError:
                return False
        return True

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=1, password=self.password or None)

    def master_port(self) -> int:
        """The master's port by the first sentinel that answers (0: none answers)."""
        for port in self.ports:
            try:
                return int(self._sentinel(port).sentinel_get_master_addr_by_name(MASTER_NAME)[1])
            except (redis.RedisError, TypeError):
                continue
        return 0

    def wait_promoted(self, timeout_s: float = 30.0) -> float:
        """After the master died: seconds until the sentinels name the replica master and it
        takes writes."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.master_port() == self.replica.port:
                try:
                    if redis.Redis(port=self.replica.port, socket_timeout=1).info("replication")["role"] == "master":
                        return time.monotonic() - start
                except redis.RedisError:
                    pass
            time.sleep(0.05)
        raise TimeoutError(f"the replica was not promoted within {timeout_s}s")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.replica.stop()
        self.master.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
