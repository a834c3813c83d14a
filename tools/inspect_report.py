"""The report of ``python -m tools.inspect``: each stream's length and each consumer group's
pending entries and lag; each live replica's last heartbeat and load; the requests in
flight, per front end, in the router's queue and on each worker group, and each group's
prompt cache (by the group's last status, as the router sees it). Read-only. The defaults
come from LS_REDIS_URL and LS_NAMESPACE, so in a container of the stack it needs no flags:
``docker compose exec router python -m tools.inspect``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

from shared.config import CommonConfig, ConfigError
from shared.heartbeat import live_replicas
from shared.inspection import latest_worker_statuses, stream_views
from shared.redis_link import RedisLink, RedisTarget
from shared.streams import (
    SERVICE_DETOK,
    SERVICE_ROUTER,
    SERVICE_TOKENIZER,
    SERVICE_VISUAL,
    SERVICE_WORKER,
    StreamNames,
)

SERVICES = (SERVICE_TOKENIZER, SERVICE_VISUAL, SERVICE_ROUTER, SERVICE_WORKER, SERVICE_DETOK)


def snapshot(link: RedisLink, names: StreamNames) -> dict[str, Any]:
    """Everything the report shows, as plain data (what --json prints)."""
    now = time.time()
    streams = [
        {"name": s.name, "length": s.length, "groups": [dataclasses.asdict(g) for g in s.groups]}
        for s in stream_views(link, names)
    ]
    replicas = []
    for service in SERVICES:
        beats = live_replicas(link, names, service)
        read = time.time()  # after the read: a beat made since `now` would show a negative age
        for name, hb in sorted(beats.items()):
            replicas.append(
                {
                    "service": service,
                    "replica": name,
                    "pid": hb.pid,
                    "heartbeat_age_s": round(read - hb.time, 3),
                    "uptime_s": round(read - hb.started, 1),
                    "load": hb.info,
                }
            )
    return {
        "time": now,
        "namespace": names.namespace,
        "streams": streams,
        "replicas": replicas,
        "in_flight": _in_flight(link, names, replicas),
    }


def _in_flight(link: RedisLink, names: StreamNames, replicas: list[dict]) -> dict[str, Any]:
    def loads(service: str) -> dict[str, dict[str, float]]:
        return {r["replica"]: r["load"] for r in replicas if r["service"] == service}

    routers, live_groups = loads(SERVICE_ROUTER), loads(SERVICE_WORKER)
    groups = {}
    statuses = latest_worker_statuses(link, names)
    read = time.time()
    for group, st in sorted(statuses.items()):
        if group not in live_groups:
            continue  # a group gone since its last status
        groups[group] = {
            "status_age_s": round(read - st.time, 3),
            "capacity_tokens": st.capacity_tokens,
            "free_tokens": st.free_tokens,
            # the prompt cache's tree: tokens no request holds (free on demand) and tokens requests hold
            "evictable_tokens": st.evictable_tokens,
            "cache_locked_tokens": st.cache_locked_tokens,
            "requests": [dataclasses.asdict(r) for r in st.running.rows()],
        }
    return {
        "fronts": {name: int(info.get("in_flight", 0)) for name, info in loads(SERVICE_TOKENIZER).items()},
        "router_waiting": sum(int(info.get("waiting", 0)) for info in routers.values()),
        "router_running": sum(int(info.get("running", 0)) for info in routers.values()),
        "groups": groups,
    }


def render(snap: dict[str, Any]) -> str:
    """The snapshot as the tables a person reads."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap["time"]))
    lines = [f"LightStream namespace {snap['namespace']!r} at {stamp}", "", "streams"]
    rows = [("stream", "length", "group", "consumers", "pending", "lag")]
    for s in snap["streams"]:
        for g in s["groups"] or [None]:
            if g is None:
                rows.append((s["name"], str(s["length"]), "-", "-", "-", "-"))
            else:
                lag = "?" if g["lag"] is None else str(g["lag"])
                rows.append((s["name"], str(s["length"]), g["name"], str(g["consumers"]), str(g["pending"]), lag))
    lines += _table(rows)
    lines += ["", "replicas"]
    rows = [("service", "replica", "pid", "heartbeat", "uptime", "load")]
    for r in snap["replicas"]:
        load = " ".join(f"{k}={v:g}" for k, v in sorted(r["load"].items())) or "-"
        rows.append(
            (
                r["service"],
                r["replica"],
                str(r["pid"]),
                f"{r['heartbeat_age_s']:.1f}s ago",
                f"{r['uptime_s']:.0f}s",
                load,
            )
        )
    lines += _table(rows)
    f = snap["in_flight"]
    fronts = " ".join(f"{k}={v}" for k, v in sorted(f["fronts"].items())) or "-"
    lines += ["", "requests in flight", f"  front ends: {fronts}"]
    lines.append(f"  router: {f['router_waiting']} waiting, {f['router_running']} placed on worker groups")
    rows = [("group", "rid", "prompt", "held", "cached", "remaining", "paused")]
    for group, g in f["groups"].items():
        used = g["capacity_tokens"] - g["free_tokens"]
        tree = g["evictable_tokens"] + g["cache_locked_tokens"]
        lines.append(
            f"  group {group}: {len(g['requests'])} requests, KV {used}/{g['capacity_tokens']} tokens in use, "
            f"prompt cache {tree} of them ({g['evictable_tokens']} evictable) (status {g['status_age_s']:.1f}s old)"
        )
        for q in g["requests"]:
            row = (group, q["rid"], str(q["prompt_tokens"]), str(q["held_tokens"]), str(q["cached_tokens"]))
            rows.append((*row, str(q["remaining_tokens"]), "yes" if q["paused"] else ""))
    if len(rows) > 1:
        lines += _table(rows)
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.inspect", description=__doc__.split("\n\n")[0])
    ap.add_argument("--redis-url", default=os.environ.get("LS_REDIS_URL", "redis://127.0.0.1:6379/0"))
    ap.add_argument("--redis-sentinel", default=os.environ.get("LS_REDIS_SENTINEL", ""), help="host:port,...")
    ap.add_argument("--redis-master-name", default=os.environ.get("LS_REDIS_MASTER_NAME", "mymaster"))
    ap.add_argument("--namespace", default=os.environ.get("LS_NAMESPACE", "ls"))
    ap.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    ap.add_argument("--watch", type=float, default=0.0, metavar="SECONDS", help="print it again every SECONDS")
    args = ap.parse_args(argv)
    try:
        common = CommonConfig(
            redis_url=args.redis_url, redis_sentinel=args.redis_sentinel, redis_master_name=args.redis_master_name
        )
    except ConfigError as e:
        ap.error(str(e))
    link = RedisLink(RedisTarget.of(common))
    if not link.ping():  # the link would wait for Redis forever; a person wants to know now
        print(f"cannot reach Redis at {link.target}", file=sys.stderr)
        return 2
    names = StreamNames(args.namespace)
    try:
        while True:
            snap = snapshot(link, names)
            print(json.dumps(snap, indent=2) if args.json else render(snap), flush=True)
            if args.watch <= 0:
                return 0
            time.sleep(args.watch)
            print(flush=True)
    except KeyboardInterrupt:
        return 0
    finally:
        link.close()
