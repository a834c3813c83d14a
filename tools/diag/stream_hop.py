"""One Redis stream hop between two processes, made as the services make it, after idle.

    python tools/diag/stream_hop.py [--redis-server PATH] [--blocks 1000,5] [--idle-ms 200] [--pin A,B]

A sends a 1.2 KB entry with XADD; B, waiting in a blocking read (a pipeline of the lease
SET and XREADGROUP, as StreamReader.read), answers with a MULTI of XADD and XACK (as
StreamWriter.send_many with acknowledgements); A reads the answer the same way. Half the
round trip is one hop. Each round trip comes after --idle-ms in which both sides wait in
reads of BLOCK ms (a read that comes back empty is made again), so the figure for a BLOCK
is what a lone request's hop costs when the services read that way; back to back (no idle)
is the warm figure. A BLOCK of 0 polls without blocking (both sides spin). --pin keeps A and
B each on one CPU (and redis-server on a third, the next one). Prints one JSON line per BLOCK.

Redis ends a BLOCK that nothing answers on its own clock (every 100 ms at the default hz 10),
so any BLOCK below 100 ms waits like one of 100 ms: only 0 (polling) differs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import redis

from tools.redis_server import RedisServer


def read(r: redis.Redis, stream: str, consumer: str, block_ms: int, until: float = 0.0) -> list:
    while True:
        pipe = r.pipeline(transaction=False)
        pipe.set(f"lease:{consumer}", b"1", px=5000)
        pipe.xreadgroup("g", consumer, {stream: ">"}, count=256, block=block_ms or None)
        got = pipe.execute()[1]
        if got or (until and time.perf_counter() > until):
            return got


def answer(url: str, block_ms: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    r = redis.Redis.from_url(url)
    while True:
        for _stream, entries in read(r, "ping", "b", block_ms):
            for entry_id, fields in entries:
                if fields[b"m"] == b"stop":
                    return
                pipe = r.pipeline(transaction=True)
                pipe.xadd("pong", {b"m": fields[b"m"]}, maxlen=1000, approximate=True)
                pipe.xack("ping", "g", entry_id)
                pipe.execute()


def measure(url: str, block_ms: int, idle_s: float, rounds: int, pin: tuple[int, int] | None = None) -> dict:
    if pin is not None:
        os.sched_setaffinity(0, {pin[0]})
    r = redis.Redis.from_url(url)
    r.flushall()
    for stream in ("ping", "pong", "idle"):
        r.xgroup_create(stream, "g", id="0", mkstream=True)
    b = mp.get_context("spawn").Process(target=answer, args=(url, block_ms, pin[1] if pin else None))
    b.start()
    time.sleep(0.5)
    payload = os.urandom(1200)
    hops = []
    for _ in range(rounds):
        if idle_s:
            read(r, "idle", "a", block_ms, until=time.perf_counter() + idle_s)
        t = time.perf_counter()
        r.xadd("ping", {b"m": payload}, maxlen=1000, approximate=True)
        read(r, "pong", "a", block_ms)
        hops.append((time.perf_counter() - t) / 2)
    r.xadd("ping", {b"m": b"stop"})
    b.join()
    hops.sort()
    return {
        "block_ms": block_ms,
        "idle_ms": 1000 * idle_s,
        "rounds": rounds,
        "hop_ms_median": 1000 * statistics.median(hops),
        "hop_ms_p90": 1000 * hops[int(0.9 * (len(hops) - 1))],
        "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
        "pinned": list(pin) if pin else None,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--blocks", default="1000,5")
    ap.add_argument("--idle-ms", type=float, default=200.0)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--pin", default="", help="A,B: the CPUs of the two sides (redis-server gets B+1)")
    args = ap.parse_args(argv)
    pin = tuple(int(c) for c in args.pin.split(",")) if args.pin else None
    out = []
    with RedisServer(binary=args.redis_server) as server:
        if pin is not None:
            os.sched_setaffinity(server.proc.pid, {pin[1] + 1})
        out.append(measure(server.url, 1000, 0.0, 4 * args.rounds, pin))  # back to back: warm
        for block in (int(b) for b in args.blocks.split(",")):
            out.append(measure(server.url, block, args.idle_ms / 1000, args.rounds, pin))
    for row in out:
        print(json.dumps(row), flush=True)
    return out


if __name__ == "__main__":
    main()
