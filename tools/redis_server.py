"""Start a throwaway redis-server on a free local port (for run_local.py and the tests)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, port: int | None = None, binary: str = "redis-server") -> None:
        self.port = port or free_port()
        self.binary = shutil.which(binary) or binary
        self.dir = tempfile.mkdtemp(prefix="lightstream-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--protected-mode",
            "no",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if client.ping():
                    return self
            except redis.ConnectionError:
                time.sleep(0.05)
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

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
