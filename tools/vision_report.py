"""tools/bench_vision.py's figures: the visual replicas' counters read from their heartbeats, the
encoder's rates from them, and each family's ratios.

A replica's heartbeat carries its counters (services/visual/metrics.py): images through the
tower, seconds in the tower and projector (the rows back on the host), seconds encoding whole
batches (preparing included) and batches. A run's figures are the differences across it.
"""

from __future__ import annotations

import time

from shared.heartbeat import live_replicas
from shared.redis_link import RedisLink
from shared.streams import SERVICE_VISUAL, StreamNames

COUNTERS = ("images", "tower_seconds", "encode_seconds", "batches", "cache_misses", "cache_hits")


def visual_counters(redis_url: str, namespace: str, timeout_s: float = 5.0) -> dict[str, dict[str, float]]:
    """Each live visual replica's counters, from a heartbeat it sent after this call began (one a
    second: the counters include everything before the call)."""
    since = time.time()
    link = RedisLink(redis_url)
    try:
        while True:
            beats = live_replicas(link, StreamNames(namespace), SERVICE_VISUAL, once=True)
            if all(hb.time > since for hb in beats.values()) or time.time() > since + timeout_s:
                break
            time.sleep(0.1)
    finally:
        link.close()
    return {name: {k: hb.info.get(k, 0.0) for k in COUNTERS} for name, hb in sorted(beats.items())}


def encoder_figures(run: dict, flops_per_image: float, matmul_tflops: float | None) -> dict:
    """A run's encoder: per replica, what it encoded and its batched rate while in the tower
    (images / tower seconds, and that in TFLOP/s against the matmul rate); for the stack, the
    images over the run's wall time. Replicas sharing a GPU overlap in time, so their batched
    rates are each their own, not a sum."""
    before, after = run["visual"]["before"], run["visual"]["after"]
    duration = run["serving"].get("duration_s") or 0.0
    replicas = {}
    for name, now in after.items():
        d = {k: now[k] - before.get(name, {}).get(k, 0.0) for k in COUNTERS}
        tower = d["tower_seconds"]
        d["tower_images_per_s"] = d["images"] / tower if tower else None
        d["tower_TFLOPs"] = d["images"] * flops_per_image / tower / 1e12 if tower else None
        d["tower_of_matmul"] = d["tower_TFLOPs"] / matmul_tflops if d["tower_TFLOPs"] and matmul_tflops else None
        d["tower_busy"] = tower / duration if duration else None  # the share of the run it spent in the tower
        replicas[name] = d
    images = sum(d["images"] for d in replicas.values())
    wall = images * flops_per_image / duration / 1e12 if duration else None
    return {
        "replicas": replicas,
        "images": images,
        "images_per_s": images / duration if duration else None,
        "wall_TFLOPs": wall,
        "wall_of_matmul": wall / matmul_tflops if wall and matmul_tflops else None,
    }


def family_ratios(row: dict, family: str, counts: list[int]) -> dict:
    """The stack's requests/s over the peer's on the same requests (the fewest replicas' serve
    run), and each replica count's encode images/s and serve requests/s, the most replicas' over
    the fewest's."""
    runs = row["runs"]

    def figure(count: int, kind: str, key: str) -> float | None:
        run = runs.get(f"{family}-v{count}-{kind}")
        if run is None or run["serving"].get("failed"):
            return None
        return run["encoder"][key] if key == "images_per_s" else run["serving"].get(key)

    out: dict = {
        "encode_images_per_s": {c: figure(c, "encode", "images_per_s") for c in counts},
        "serve_req_per_s": {c: figure(c, "serve", "req_per_s") for c in counts},
    }
    most, fewest = out["encode_images_per_s"][counts[0]], out["encode_images_per_s"][counts[-1]]
    if len(counts) > 1 and most and fewest:
        out[f"encode_v{counts[0]}_over_v{counts[-1]}"] = most / fewest
    peer = (row.get("peer") or {}).get("batched") or {}
    done = peer.get("requests_done") == peer.get("requests") and peer and not peer.get("stopped")
    stack = out["serve_req_per_s"][counts[-1]]
    if done and peer.get("req_per_s"):
        out["peer_req_per_s"] = peer["req_per_s"]
        out["stack_over_peer"] = stack / peer["req_per_s"] if stack else None
    elif "peer" in row:
        job = row["peer"].get("job", {})
        why = "timed out" if job.get("timed_out") else "no result: see its log"
        out["peer_error"] = row["peer"].get("error") or peer.get("stopped") or why
    return out
