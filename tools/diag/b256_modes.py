"""Why one engine steps batch 256 in about 14 ms and another, same code, in 16-17.

Builds the engine as benchmark_engine.py does, puts 256 requests of context 1024 in the
decode state (as profile_decode.py does), and reports: the BLAS library each projection of
the 256 bucket was captured with, how contiguous the requests' KV slots are, the decode
graph's replay time, and its kernels' device time by name (torch.profiler over replays).
Run it in several processes to compare them.

    python3 tools/diag/b256_modes.py [--batch 256] [--context 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
from torch.profiler import ProfilerActivity, profile

from tools.benchmark_engine import make_engine, parse_args
from tools.profile_decode import _time, decode_state, profile_case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args()
    engine, cfg, _ = make_engine(parse_args(["--out", "-", "--running-max-req-size", "2048"]))
    graphs = engine.runner.graphs
    bucket = graphs.bucket(args.batch)
    row: dict = {"batch": args.batch, "bucket": bucket, "blas": graphs.blas[bucket]}
    eager = profile_case(engine, cfg, args.batch, args.context)  # fills and frees a batch: the allocator moves on
    row["eager_device_ms"] = round(eager["device_ms_per_step"], 3)
    reqs, batch = decode_state(engine, cfg, args.batch, args.context, seed=9)
    slots = torch.cat([engine.kv.table.table[r.row, : args.context] for r in reqs]).long()
    row["adjacent_slots"] = round(float((slots[1:] == slots[:-1] + 1).float().mean()), 4)
    row["graph_wall_ms"] = round(_time(lambda: engine.runner.forward(batch)), 3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            engine.runner.forward(batch)
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = defaultdict(float)
    for evt in prof.key_averages():
        if evt.device_time_total > 0:
            per_kernel[evt.key[:70]] += evt.device_time_total / 5 / 1000.0
    row["graph_kernels_ms"] = {k: round(v, 3) for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:10]}
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
