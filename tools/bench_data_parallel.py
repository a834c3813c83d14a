"""Offline throughput of N data-parallel engines, one per GPU, on the fixed workload.

    python tools/bench_data_parallel.py --groups 2 --out FILE.json [--requests 2000] [--device cuda]
        [-- more tools/benchmark_engine.py flags]

Starts N processes of tools/benchmark_engine.py --parts offline, process I on GPU I
(CUDA_VISIBLE_DEVICES) with --shard I/N: the workload's requests dealt in turn, as the
router spreads them over equal groups. They build and warm up on their own, meet at a
barrier, and run; the figure is all N's requests over the time from the first start to the
last end. This is the data-parallel side of the comparison with one tensor-parallel group
over the same GPUs (tools/benchmark_engine.py --tp N).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait_all(procs: list, timeout_s: float) -> list[dict]:
    """Wait for every group; -> each one's offline figures (SystemExit naming the groups that failed)."""
    deadline = time.monotonic() + timeout_s
    failed = []
    for i, (proc, log, _) in enumerate(procs):
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
        log.close()
        if code != 0:
            failed.append(f"group {i} exited with {code} (log: {log.name})")
    if failed:
        raise SystemExit("; ".join(failed))
    parts = []
    for _, _, path in procs:
        with open(path) as f:
            parts.append(json.load(f)["offline"])
    return parts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--device", default="cuda", help="cuda: group I on GPU I; cpu: all on the CPU (for tests)")
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("engine_args", nargs="*", help="after --: more flags for benchmark_engine.py")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="lightstream-dp-")
    procs = []
    for i in range(args.groups):
        env = dict(os.environ)
        if args.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(i)
        part = os.path.join(work, f"group{i}.json")
        cmd = [
            sys.executable,
            os.path.join(ROOT, "tools", "benchmark_engine.py"),
            "--parts",
            "offline",
            "--device",
            args.device,
            "--requests",
            str(args.requests),
            "--shard",
            f"{i}/{args.groups}",
            "--barrier",
            os.path.join(work, "barrier"),
            "--out",
            part,
            *args.engine_args,
        ]
        log = open(os.path.join(work, f"group{i}.log"), "w")  # noqa: SIM115 (closed when the process is waited for)
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log, part))
    parts = _wait_all(procs, args.timeout_s)
    start, end = min(p["started_unix"] for p in parts), max(p["ended_unix"] for p in parts)
    seconds = end - start
    requests = sum(p["requests"] for p in parts)
    out_tokens = sum(p["output_tokens"] for p in parts)
    in_tokens = sum(p["mean_input"] * p["requests"] for p in parts)
    res = {
        "date": time.strftime("%Y-%m-%d"),
        "groups": args.groups,
        "device": args.device,
        "requests": requests,
        "seconds": seconds,
        "start_skew_s": max(p["started_unix"] for p in parts) - start,
        "req_per_s": requests / seconds,
        "output_tok_per_s": out_tokens / seconds,
        "total_tok_per_s": (out_tokens + in_tokens) / seconds,
        "per_group": [{k: p[k] for k in ("requests", "seconds", "req_per_s", "steps")} for p in parts],
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)  # kept only when a group failed, for its log
    print("data_parallel", json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    main()
