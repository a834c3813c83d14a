"""Start a throwaway redis-server on a free local port (for run_local.py and the tests)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from urllib.parse import quote

import redis

from shared.redis_link import client

_handed_out: set[int] = set()
LOWEST_PORT = 20000


def free_port() -> int:
    """A TCP port nothing listens on, for a process started next to bind.

    Drawn below the kernel's ephemeral range, so that no outgoing connection (a service's
    to Redis) is given it before that process binds it, and never the same one twice in
    this process: a port from bind(0) is in that range, and is free again the moment its
    probe closes, so two callers in a row could be handed the same one."""
    top = _ephemeral_low() - 1
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randint(LOWEST_PORT, top) if top > LOWEST_PORT else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))  # every address: a listener on any of them makes it taken
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise RuntimeError("no free TCP port found")


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class RedisServer:
    def __init__(
        self,
        port: int | None = None,
        binary: str = "redis-server",
        appendonly: bool = False,
        replicaof: int = 0,
        maxmemory: str = "",
        bind: str = "127.0.0.1",
        password: str = "",
    ) -> None:
        """``replicaof``: the port of a local master this server replicates (tools/redis_sentinel.py);
        ``maxmemory``: Redis's bound ("1gb"), with writes refused past it (noeviction: evicting a
        stream would lose requests silently); none: no bound. ``bind``: the address it listens on,
        and its URL's (another host's services need this host's address: tests/integration/test_hosts.py).
        ``password``: clients must give it (requirepass), written to a file of this server's own
        rather than onto its command line, which every user of the host can read; the URL carries it."""
        self.port = port or free_port()
        self.bind = bind
        self.binary = shutil.which(binary) or binary
        self.replicaof = replicaof
        self.maxmemory = maxmemory
        if any(c in password for c in '"\\ \n'):
            raise ValueError("a password without quotes, backslashes or spaces")
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="lightstream-redis-")
        # append-only, fsync every second, as compose runs it: a restart keeps the streams
        self.appendonly = appendonly
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}{self.bind}:{self.port}/0"

    def _config_file(self) -> list[str]:
        """The settings kept off the command line, as a config file only its owner reads."""
        if not self.password:
            return []
        path = os.path.join(self.dir, "auth.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{self.password}"\n')
        return [path]

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            *self._config_file(),
            "--port",
            str(self.port),
            "--bind",
            self.bind,
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            self.dir,
            "--protected-mode",
            "no",
        ]
        if self.replicaof:
            args += ["--replicaof", "127.0.0.1", str(self.replicaof)]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = client(self.url, socket_connect_timeout=0.5)  # this loop retries
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if probe.ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def kill(self) -> None:
        """Kill it (SIGKILL: a crash, no goodbye to replicas or clients), keeping its files: start()
        again restarts it on the same port."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    server = RedisServer().start()
    print(server.url, flush=True)
    try:
        os.waitpid(server.proc.pid, 0)  # type: ignore[union-attr]
    except KeyboardInterrupt:
        server.stop()
