"""python -m tools.inspect against the compose stack, while a request is in flight; and the
name tools.inspect hiding nothing from scripts run out of tools/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

from tests.ops.compose_local import ROOT, LocalCompose


def inspect(stack: LocalCompose, *args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "tools.inspect", "--redis-url", stack.redis_url, *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)


def snapshot(stack: LocalCompose) -> dict[str, Any]:
    r = inspect(stack, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_streams_replicas_and_requests_in_flight(compose_stack: LocalCompose) -> None:
    # one long request after another, so that one is nearly always in flight while inspect runs
    body = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 800, "ignore_eos": True}}
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            httpx.post(compose_stack.url + "/generate", json=body, timeout=120)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        end = time.monotonic() + 60
        while True:  # until a group's status, a front end's heartbeat (each second) and the report show one
            snap = snapshot(compose_stack)
            held = [q for g in snap["in_flight"]["groups"].values() for q in g["requests"]]
            if held and sum(snap["in_flight"]["fronts"].values()):
                text = inspect(compose_stack)
                if re.search(r"^  \S+ +[0-9a-f]{32} +\d+ +\d+ +\d+", text.stdout, flags=re.M):
                    break
            assert time.monotonic() < end, "no request seen in flight"
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join()

    assert held[0]["held_tokens"] > 0 and held[0]["remaining_tokens"] > 0, snap["in_flight"]
    assert len(held) <= 2, held  # one at a time (a finished one may linger in a status for 20 ms)

    by_service: dict[str, list[dict]] = {}
    for r in snap["replicas"]:
        by_service.setdefault(r["service"], []).append(r)
        assert -0.5 < r["heartbeat_age_s"] < 5, r  # a replica's clock and this one's may differ a little
    assert {s: len(rs) for s, rs in by_service.items()} == {"tokenizer": 2, "router": 1, "worker": 2, "detokenizer": 2}
    assert all(w["load"]["capacity_tokens"] > 0 for w in by_service["worker"])
    assert "in_flight" in by_service["tokenizer"][0]["load"] and "waiting" in by_service["router"][0]["load"]

    streams = {s["name"]: s for s in snap["streams"]}
    expected = {"ls:router"}
    expected |= {f"ls:worker:{w['replica']}" for w in by_service["worker"]}
    expected |= {f"ls:detok:{d['replica']}" for d in by_service["detokenizer"]}
    expected |= {f"ls:front:{t['replica']}" for t in by_service["tokenizer"]}
    assert expected <= set(streams), sorted(streams)
    router = {g["name"]: g for g in streams["ls:router"]["groups"]}["router"]
    assert streams["ls:router"]["length"] > 0 and router["consumers"] == 1
    assert isinstance(router["pending"], int) and isinstance(router["lag"], int)

    assert text.returncode == 0, text.stderr
    for heading in ("streams", "replicas", "requests in flight", "ls:router", "detokenizer"):
        assert heading in text.stdout, text.stdout


def test_nothing_in_flight_after_the_requests_end(compose_stack: LocalCompose) -> None:
    def idle(f: dict[str, Any]) -> bool:
        busy = any(g["requests"] for g in f["groups"].values())
        return not busy and sum(f["fronts"].values()) == 0 and f["router_running"] == f["router_waiting"] == 0

    end = time.monotonic() + 10  # heartbeats refresh every second, statuses every half
    while not idle(f := snapshot(compose_stack)["in_flight"]) and time.monotonic() < end:
        time.sleep(0.2)
    assert idle(f), f


def test_an_unreachable_redis_is_said_at_once() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "tools.inspect", "--redis-url", "redis://127.0.0.1:1/0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "cannot reach Redis" in r.stderr


def test_scripts_in_tools_still_get_the_standard_inspect() -> None:
    """`python tools/x.py` puts tools/ first on sys.path, where a regular module or package named
    inspect would hide the standard library's inspect from everything the script imports."""
    probe = (
        "import sys; sys.path.insert(0, 'tools'); import inspect; assert inspect.__file__.startswith(sys.base_prefix)"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT)
    assert r.returncode == 0
    r = subprocess.run([sys.executable, "tools/make_tiny_model.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "usage" in r.stdout, r.stderr
