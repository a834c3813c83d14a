"""What a wake costs on this host, and whether CPUs kept from halting take it away.

    python tools/diag/wake_cost.py [--redis-server PATH] [--n 2000]

Round trips, median and 90th percentile in ms, each measured twice: as the host is, and
with a SCHED_IDLE spinner on every CPU (a process that runs only when nothing else wants
the CPU, so an idle CPU never halts, and a thread woken on it has the CPU at once):
  pipe ping-pong        two processes, one byte each way through pipes, each asleep in read
  pipe, 2 ms apart      the same with a pause between round trips
  redis PING            redis-py, asleep in recv while Redis answers
  redis PING, 2 ms      the same with a pause
  redis PING, spinning  a non-blocking socket read in a loop until the reply is in
Used for docs/benchmarks.md: is a polled Redis hop slow for the wakes on its way?
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import contextlib

import redis

from tools.diag import keep_awake
from tools.redis_server import RedisServer


def timed(n: int, once: Callable[[], None], gap_s: float) -> list[float]:
    out = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter()
        once()
        out.append(time.perf_counter() - t)
    return out[n // 10 :]


def pipe_pingpong(n: int, gap_s: float) -> list[float]:
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(a_w)
        os.close(b_r)
        while os.read(a_r, 1):
            os.write(b_w, b"y")
        os._exit(0)

    def once() -> None:
        os.write(a_w, b"x")
        os.read(b_r, 1)

    os.close(a_r)
    os.close(b_w)
    lat = timed(n, once, gap_s)
    os.close(a_w)
    os.waitpid(pid, 0)
    os.close(b_r)
    return lat


def redis_ping(url: str, n: int, gap_s: float) -> list[float]:
    r = redis.Redis.from_url(url)
    return timed(n, r.ping, gap_s)


def spinning_ping(port: int, n: int) -> list[float]:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(False)

    def once() -> None:
        s.send(b"*1\r\n$4\r\nPING\r\n")
        got = b""
        while not got.endswith(b"\r\n"):
            with contextlib.suppress(BlockingIOError):
                got += s.recv(64)

    lat = timed(n, once, 0.0)
    s.close()
    return lat


def report(name: str, lat: list[float]) -> None:
    lat = sorted(lat)
    print(
        f"{name:34s} median {1000 * statistics.median(lat):.3f} ms  p90 {1000 * lat[int(0.9 * len(lat))]:.3f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    srv = RedisServer(binary=args.redis_server).start()
    try:
        for spin in (False, True):
            procs = keep_awake.start() if spin else []
            tag = " (spinners)" if spin else ""
            try:
                report("pipe ping-pong" + tag, pipe_pingpong(args.n, 0.0))
                report("pipe, 2 ms apart" + tag, pipe_pingpong(args.n // 4, 0.002))
                report("redis PING" + tag, redis_ping(srv.url, args.n, 0.0))
                report("redis PING, 2 ms apart" + tag, redis_ping(srv.url, args.n // 4, 0.002))
                report("redis PING, spinning read" + tag, spinning_ping(srv.port, args.n))
            finally:
                keep_awake.stop(procs)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
