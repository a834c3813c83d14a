"""A soak: the whole stack on this machine (tools/stack.py; the tiny model unless --model-dir)
under --clients concurrent clients for --minutes, and whether anything grows while it serves.

Sampled every --sample-s: Redis's used_memory and the RSS of every process (each service and
redis-server). Each series' growth is the mean of its last --window-s against the mean of the
window right after --warmup-s (a process fills its caches and pools in its first minute). At
the end, with the load stopped, each worker group's KV pool must be all free (free plus
evictable cached tokens equal to its capacity), and every request is counted as completed,
ended by an error, or lost (no answer within --bound-s). One JSON report on stdout (and --out):

    python -m tools.soak --minutes 10 --clients 16 --out soak.json

--mix names the kinds of request each client cycles through (tools/soak_requests.py: /generate,
shared prefixes, streams left early, JSON schemas, regular expressions, scored prompts, sampling
held to allowed tokens, bad requests); each must be answered as its kind says, and the report
counts them by kind.

    python -m tools.soak --minutes 8 --clients 12 --mix generate,prefix,stream-left,schema,regex,score,bad
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shared.inspection import latest_worker_statuses
from shared.redis_link import RedisLink, RedisTarget
from shared.streams import StreamNames
from tools import make_tiny_model
from tools.redis_server import RedisServer, free_port
from tools.soak_requests import CHECKS, KINDS
from tools.stack import Stack, StackOptions

NAMESPACE = "soak"
REDIS_MAXMEMORY = "1gb"  # as lightstream serve runs it


@dataclass(frozen=True)
class SoakOptions:
    minutes: float = 10.0
    clients: int = 16
    workers: int = 2
    fronts: int = 2
    max_new: tuple[int, ...] = (8, 16, 32, 64)  # cycled: short and long requests side by side
    warmup_s: float = 60.0
    window_s: float = 60.0
    sample_s: float = 5.0
    bound_s: float = 60.0
    model_dir: str = ""
    log_dir: str = ""
    mix: tuple[str, ...] = ("generate",)  # tools/soak_requests.py's kinds, cycled

    def __post_init__(self) -> None:
        unknown = [k for k in self.mix if k not in KINDS]
        if unknown or not self.mix:
            raise ValueError(f"--mix: kinds of {KINDS}, got {list(self.mix)}")
        if self.warmup_s + 2 * self.window_s > self.minutes * 60:
            raise ValueError("the run must hold the warm-up and two windows: --minutes too short")


@dataclass
class Counts:
    completed: int = 0
    errors: int = 0
    lost: int = 0
    error_samples: list[str] = field(default_factory=list)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, kind: str, error: str = "", request: str = "generate") -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        mine = self.by_kind.setdefault(request, {"completed": 0, "errors": 0, "lost": 0})
        mine[kind] += 1
        if error and len(self.error_samples) < 5:
            self.error_samples.append(error[:300])


async def _one(
    client: httpx.AsyncClient, request: str, model: str, prompt: str, max_new: int, bound_s: float, counts: Counts
) -> None:
    """One request of the kind named, counted: completed (answered as its kind says), an error
    (answered otherwise, or the connection failed) or lost (no answer within bound_s)."""
    try:
        wrong = await asyncio.wait_for(CHECKS[request](client, model, prompt, max_new), bound_s)
    except (TimeoutError, httpx.TimeoutException):
        counts.add("lost", f"{request}: no answer within {bound_s:g}s", request)
        return
    except httpx.TransportError as e:
        counts.add("errors", f"{request}: {type(e).__name__}: {e}", request)
        return
    counts.add("errors" if wrong else "completed", wrong or "", request)


async def _load(url: str, opts: SoakOptions, counts: Counts) -> None:
    """``opts.clients`` clients, each one request after the other (their kinds cycled through
    opts.mix), until the run's end; the requests in flight then finish (or are lost) before this
    returns."""
    end = time.monotonic() + opts.minutes * 60
    sizes = itertools.cycle(opts.max_new)
    kinds = itertools.cycle(opts.mix)
    numbers = itertools.count()
    limits = httpx.Limits(max_connections=opts.clients, max_keepalive_connections=opts.clients)

    async def client_loop(client: httpx.AsyncClient, model: str) -> None:
        while time.monotonic() < end:
            i = next(numbers)
            prompt = f"Soak request {i}: the river, the {i % 13} bridges and the town by the sea"
            await _one(client, next(kinds), model, prompt, next(sizes), opts.bound_s, counts)

    async with httpx.AsyncClient(base_url=url, timeout=opts.bound_s + 5, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await asyncio.gather(*(client_loop(client, model) for _ in range(opts.clients)))


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return None  # exited


class Sampler(threading.Thread):
    """Redis's used_memory and each process's RSS every ``every_s``, as (seconds, bytes) series."""

    def __init__(self, link: RedisLink, pids: dict[str, int], every_s: float) -> None:
        super().__init__(daemon=True)
        self.link, self.pids, self.every_s = link, pids, every_s
        self.series: dict[str, list[tuple[float, int | None]]] = {"redis_used_memory": []}
        self.series.update({f"rss:{name}": [] for name in pids})
        self.started = time.monotonic()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = round(time.monotonic() - self.started, 1)
            used = self.link.call(lambda r: r.info("memory"))["used_memory"]
            self.series["redis_used_memory"].append((t, int(used)))
            for name, pid in self.pids.items():
                self.series[f"rss:{name}"].append((t, _rss_bytes(pid)))
            self.done.wait(self.every_s)


def growth(samples: list[tuple[float, int | None]], warmup_s: float, window_s: float, end_s: float) -> dict:
    """The mean of the last window against the mean of the window after the warm-up."""

    def mean(lo: float, hi: float) -> float | None:
        values = [v for t, v in samples if lo <= t < hi and v is not None]
        return sum(values) / len(values) if values else None

    warm, last = mean(warmup_s, warmup_s + window_s), mean(end_s - window_s, end_s + 1)
    exited = any(v is None for _, v in samples)
    ratio = None if warm is None or last is None or exited else round(last / warm, 4)
    values = [v for t, v in samples if t >= warmup_s and v is not None]
    return {
        "after_warmup": None if warm is None else round(warm),
        "end": None if last is None else round(last),
        "ratio": ratio,  # end / after_warmup; None: the process exited, or no samples
        "max_after_warmup": max(values) if values else None,
        "first": samples[0][1] if samples else None,
    }


def kv_at_end(link: RedisLink, names: StreamNames, workers: int, timeout_s: float = 15.0) -> dict[str, Any]:
    """Each group's KV pool once the load has stopped: all free when free plus evictable (cached
    tokens no request holds) is the capacity. Waits for statuses that show it, up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = latest_worker_statuses(link, names)
        groups = {
            g: {
                "capacity": st.capacity_tokens,
                "free": st.free_tokens,
                "evictable": st.evictable_tokens,
                "running": len(st.running.rids),
            }
            for g, st in sorted(statuses.items())
        }
        all_free = len(groups) == workers and all(
            v["free"] + v["evictable"] == v["capacity"] and v["running"] == 0 for v in groups.values()
        )
        if all_free or time.monotonic() > deadline:
            return {"groups": groups, "all_free": all_free}
        time.sleep(0.5)


def _stack(opts: SoakOptions, redis_url: str, log_dir: str) -> Stack:
    model_dir = opts.model_dir
    if not model_dir:
        model_dir = os.path.join(tempfile.mkdtemp(prefix="soak-"), "tiny")
        make_tiny_model.main(["--out", model_dir])
    return Stack(
        StackOptions(
            model_dir=model_dir,
            redis_url=redis_url,
            port=free_port(),
            workers=opts.workers,
            fronts=opts.fronts,
            namespace=NAMESPACE,
            log_dir=log_dir,
            worker_args=["--device", "cpu"],
        )
    )


def soak(opts: SoakOptions) -> dict[str, Any]:
    """Start Redis and the stack, load it for opts.minutes while sampling, then report."""
    log_dir = opts.log_dir or tempfile.mkdtemp(prefix="soak-logs-")
    with RedisServer(appendonly=True, maxmemory=REDIS_MAXMEMORY) as redis_server:
        stack = _stack(opts, redis_server.url, log_dir)
        link = RedisLink(RedisTarget(redis_server.url))
        try:
            stack.start().wait_ready(timeout_s=300)
            pids = {name: svc.proc.pid for name, svc in stack.services.items() if svc.proc is not None}
            assert redis_server.proc is not None
            pids["redis-server"] = redis_server.proc.pid
            sampler = Sampler(link, pids, opts.sample_s)
            counts = Counts()
            started = time.monotonic()
            sampler.start()
            asyncio.run(_load(stack.url, opts, counts))
            sampler.done.set()
            sampler.join()
            elapsed = time.monotonic() - started
            kv = kv_at_end(link, StreamNames(NAMESPACE), opts.workers)
        finally:
            stack.stop()
            link.close()
    return _report(opts, sampler.series, counts, kv, elapsed, log_dir)


def _report(
    opts: SoakOptions, series: dict[str, list], counts: Counts, kv: dict[str, Any], elapsed: float, log_dir: str
) -> dict[str, Any]:
    end_s = opts.minutes * 60
    grown = {name: growth(samples, opts.warmup_s, opts.window_s, end_s) for name, samples in series.items()}
    return {
        "options": {k: v for k, v in vars(opts).items() if k not in ("model_dir", "log_dir")},
        "elapsed_s": round(elapsed, 1),
        "requests": {
            "completed": counts.completed,
            "errors": counts.errors,
            "lost": counts.lost,
            "per_second": round(counts.completed / elapsed, 2),
            "by_kind": counts.by_kind,
            "error_samples": counts.error_samples,
        },
        "redis_used_memory": grown.pop("redis_used_memory"),
        "rss": {name.removeprefix("rss:"): g for name, g in grown.items()},
        "kv_at_end": kv,
        "series": series,
        "log_dir": log_dir,
    }


def flat(report: dict[str, Any], tolerance: float = 0.10) -> list[str]:
    """What broke the soak's bounds (none: it passed): growth past tolerance, a request not
    completed, KV still held at the end."""
    problems = []
    named = {"redis_used_memory": report["redis_used_memory"], **{f"rss {k}": v for k, v in report["rss"].items()}}
    for name, g in named.items():
        if g["ratio"] is None or g["ratio"] > 1 + tolerance:
            problems.append(f"{name}: {g['after_warmup']} -> {g['end']} bytes (ratio {g['ratio']})")
    req = report["requests"]
    if req["errors"] or req["lost"] or not req["completed"]:
        problems.append(f"requests: {req['completed']} completed, {req['errors']} errors, {req['lost']} lost")
    if not report["kv_at_end"]["all_free"]:
        problems.append(f"KV not all free at the end: {report['kv_at_end']['groups']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = SoakOptions()
    ap.add_argument("--minutes", type=float, default=d.minutes)
    ap.add_argument("--clients", type=int, default=d.clients)
    ap.add_argument("--workers", type=int, default=d.workers, help="worker groups")
    ap.add_argument("--fronts", type=int, default=d.fronts, help="front-end processes sharing the port")
    ap.add_argument("--warmup-s", type=float, default=d.warmup_s)
    ap.add_argument("--window-s", type=float, default=d.window_s)
    ap.add_argument("--sample-s", type=float, default=d.sample_s)
    ap.add_argument("--bound-s", type=float, default=d.bound_s, help="a request unanswered this long is lost")
    ap.add_argument("--model-dir", default="", help="none: the tiny model, made in a temporary directory")
    ap.add_argument("--log-dir", default="", help="each service's log; none: a temporary directory")
    ap.add_argument("--tolerance", type=float, default=0.10, help="growth allowed after the warm-up")
    ap.add_argument("--out", default="", help="also write the JSON report here")
    ap.add_argument(
        "--mix", default="generate", help=f"kinds of request, comma-separated, cycled: of {', '.join(KINDS)}"
    )
    args = vars(ap.parse_args(argv))
    args["mix"] = tuple(k for k in args["mix"].split(",") if k)
    out, tolerance = args.pop("out"), args.pop("tolerance")
    report = soak(SoakOptions(**args))
    report["problems"] = flat(report, tolerance)
    text = json.dumps(report, indent=1)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
