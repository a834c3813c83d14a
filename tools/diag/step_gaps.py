"""What a decode step runs on the device besides its CUDA graph, and for how long.

Builds the engine as benchmark_engine.py does (8B shape, random weights), puts `batch`
requests of about `context` tokens in the decode state through the engine's own steps, and
profiles a few steps of the real step loop (engine.step(), as benchmark_engine.py's static
part times it). The replays are found in the trace as the run of operations one replay of
the bucket's graph gives when profiled alone. Prints what runs between two replays, each
operation with its time and the idle gap before it, and a summary: the step period, the
graph's span, and the other operations' device time by name.

    python3 tools/diag/step_gaps.py [--batch 1,64] [--context 1024] [--steps 12] [--out FILE.json]
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
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from tools.benchmark_engine import _req, drain, make_engine, parse_args, sync
from tools.workload import random_prompts


def device_ops(prof) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every device-side event, in time order."""
    ops = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sorted(ops)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1", help="batch sizes, comma-separated")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--show", type=int, default=2, help="steps whose operations are printed one by one")
    ap.add_argument("--engine-args", default="", help="more benchmark_engine.py arguments, space-separated")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    engine, cfg, _ = make_engine(parse_args(["--out", "-", *args.engine_args.split()]))
    graphs = engine.runner.graphs
    results = []
    for batch in (int(b) for b in args.batch.split(",")):
        for k, ids in enumerate(random_prompts([args.context] * batch, cfg.vocab_size, seed=3)):
            engine.add(_req(f"g{k}", ids, args.steps + 20))
        while any(not r.decoding for r in engine.scheduler.running) or engine.scheduler.waiting:
            engine.step()
        for _ in range(4):
            engine.step()
        sync(engine.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                engine.step()
            sync(engine.device)
        drain(engine)
        ops = device_ops(prof)
        seq = _graph_sequence(engine, batch)  # the names of one replay's operations, in order
        names = [o[2] for o in ops]
        starts = [i for i in range(len(ops) - len(seq) + 1) if names[i : i + len(seq)] == seq]
        if len(starts) < 2:
            raise RuntimeError(f"{len(starts)} replays of the {len(seq)}-operation graph in {len(ops)} operations")
        steps = len(starts) - 1
        period = (ops[starts[-1]][0] - ops[starts[0]][0]) / steps
        graph_us = sum(ops[a + len(seq) - 1][1] - ops[a][0] for a in starts[:-1]) / steps
        outside: dict[str, float] = defaultdict(float)
        counts: dict[str, float] = defaultdict(float)
        lines = []
        for n, a in enumerate(starts[:-1]):
            b = starts[n + 1]
            for j in range(a + len(seq), b):  # what runs after this replay and before the next
                s0, e0, name = ops[j]
                outside[name] += (e0 - s0) / steps
                counts[name] += 1 / steps
                if n >= steps - args.show:
                    at, gap = s0 - ops[a][0], s0 - ops[j - 1][1]
                    lines.append(f"step {n}: +{at:9.1f} µs  {e0 - s0:6.1f} µs  gap {gap:6.1f}  {name[:90]}")
            if n >= steps - args.show:
                at, gap = ops[b][0] - ops[a][0], ops[b][0] - ops[b - 1][1]
                lines.append(f"step {n}: next replay at +{at:.1f} µs (gap {gap:.1f})")
        row = {"batch": batch, "context": args.context, "bucket": graphs.bucket(batch),
               "step_period_us": period, "graph_us": graph_us, "graph_ops": len(seq),
               "outside_graph_us": dict(sorted(outside.items(), key=lambda kv: -kv[1])),
               "outside_graph_ops_per_step": dict(counts)}  # fmt: skip
        print("\n".join(lines))
        print(json.dumps(row, indent=1), flush=True)
        results.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def _graph_sequence(engine, batch: int) -> list[str]:
    """The names of the operations one replay of the bucket's graph runs (profiled alone), in order."""
    graphs = engine.runner.graphs
    g = graphs.graphs[graphs.bucket(batch)]
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    return [name for _, _, name in device_ops(prof)]


if __name__ == "__main__":
    main()
