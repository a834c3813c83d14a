"""How soon a reader sees a stream entry that comes after a pause, read five ways.

    python tools/diag/reader_wake.py [--redis-server PATH] [--entries 150] [--rounds 2]

A writer process appends an entry stamped with its time.time() every 20 ms (XADD); the
reader, in this process, notes how long after the stamp it has the entry, read as:
  sync poll             XREAD without BLOCK in a loop (the router and detokenizer, polling)
  sync BLOCK            XREAD BLOCK 500 (a service that sleeps in its read)
  thread poll -> loop   a thread polls and hands each entry to a uvloop event loop that ticks
                        every 1 ms (the front end's replies, polling)
  async BLOCK, tick     redis.asyncio XREAD BLOCK 500 on a uvloop loop that ticks every 1 ms
  async BLOCK, spin     the same on a loop that never sleeps (a task awaiting sleep(0)), on
                        uvloop and on asyncio's own loop
Prints the median and 90th percentile of each, in ms (the first 5 entries left out).

Used for docs/benchmarks.md r48: whether the front end could read its replies on its event
loop, blocking, with the loop kept spinning instead of a polling thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import redis
import redis.asyncio as aredis
import uvloop

from tools.redis_server import RedisServer

STREAM = "wake"
GAP_S = 0.02


def writer(url: str, n: int) -> None:
    r = redis.Redis.from_url(url)
    time.sleep(0.5)
    for _ in range(n):
        time.sleep(GAP_S)
        r.xadd(STREAM, {b"t": repr(time.time()).encode()})


def start_writer(url: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--writer", url, "--entries", str(n)])


def report(name: str, lat: list[float]) -> None:
    lat = sorted(lat[5:])
    print(f"{name:30s} median {1000 * statistics.median(lat):.3f} ms  p90 {1000 * lat[int(0.9 * len(lat))]:.3f}")


def last_id(r: redis.Redis) -> bytes:
    r.xadd(STREAM, {b"t": b"0"})
    return r.xinfo_stream(STREAM)["last-generated-id"]


def sync_reads(url: str, n: int, block_ms: int | None) -> list[float]:
    r = redis.Redis.from_url(url)
    last, lat = last_id(r), []
    w = start_writer(url, n)
    while len(lat) < n:
        for _, entries in r.xread({STREAM: last}, count=10, block=block_ms) or []:
            for eid, fields in entries:
                lat.append(time.time() - float(fields[b"t"]))
                last = eid
    w.wait()
    return lat


def thread_poll_to_loop(url: str, n: int) -> list[float]:
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        lat: list[float] = []
        done = asyncio.Event()
        r = redis.Redis.from_url(url)
        last = last_id(r)

        def got(t: float) -> None:
            lat.append(time.time() - t)
            if len(lat) >= n:
                done.set()

        def reads() -> None:
            nonlocal last
            while not done.is_set():
                for _, entries in r.xread({STREAM: last}, count=10) or []:
                    for eid, fields in entries:
                        loop.call_soon_threadsafe(got, float(fields[b"t"]))
                        last = eid

        async def tick() -> None:
            while not done.is_set():
                await asyncio.sleep(0.001)

        ticking = asyncio.create_task(tick())
        threading.Thread(target=reads, daemon=True).start()
        w = start_writer(url, n)
        await done.wait()
        await ticking
        w.wait()
        return lat

    return uvloop.run(main())


def async_block(url: str, n: int, spin: bool, use_uvloop: bool) -> list[float]:
    async def main() -> list[float]:
        r = aredis.Redis.from_url(url)
        await r.xadd(STREAM, {b"t": b"0"})
        last = (await r.xinfo_stream(STREAM))["last-generated-id"]
        lat: list[float] = []
        stop = False

        async def awake() -> None:
            while not stop:
                await asyncio.sleep(0 if spin else 0.001)

        task = asyncio.create_task(awake())
        w = start_writer(url, n)
        while len(lat) < n:
            for _, entries in await r.xread({STREAM: last}, count=10, block=500) or []:
                for eid, fields in entries:
                    lat.append(time.time() - float(fields[b"t"]))
                    last = eid
        stop = True
        await task
        w.wait()
        await r.aclose()
        return lat

    return uvloop.run(main()) if use_uvloop else asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--entries", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--writer", default="", help=argparse.SUPPRESS)  # the writer process: its Redis URL
    args = ap.parse_args()
    if args.writer:
        writer(args.writer, args.entries)
        return
    srv = RedisServer(binary=args.redis_server).start()
    n = args.entries
    try:
        for _ in range(args.rounds):
            report("sync poll", sync_reads(srv.url, n, None))
            report("sync BLOCK", sync_reads(srv.url, n, 500))
            report("thread poll -> loop (1 ms tick)", thread_poll_to_loop(srv.url, n))
            report("async BLOCK, tick (uvloop)", async_block(srv.url, n, spin=False, use_uvloop=True))
            report("async BLOCK, spin (uvloop)", async_block(srv.url, n, spin=True, use_uvloop=True))
            report("async BLOCK, spin (asyncio)", async_block(srv.url, n, spin=True, use_uvloop=False))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
