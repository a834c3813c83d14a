"""Does prefetching the next weights into L2 from a side stream shorten a decode step?

Two parts, one JSON line per point:
  micro   32 layers' o projections (33.5 MB each) at batch 1 in one graph, each after a sleep
          standing in for attention, with its weights prefetched beside the sleep or not
  engine  the engine's own decode steps (random Llama-3-8B weights, benchmark_engine's static
          loop) with the decode graphs captured under each plan of --plans, in turn

    python3 tools/diag/l2_prefetch.py [--parts micro,engine] [--static 1x1024,4x1024,16x1024,64x1024]
        [--plans ";o=all;o=all,gate_up=16M,down=16M,qkv=16M"] [--variants bulk:4096,line:1024]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.cuda_graphs import DecodeGraphs
from services.worker.kernels.l2_prefetch import l2_prefetch
from services.worker.l2_ahead import parse_plan
from tools.bench_blas import graph_ms
from tools.benchmark_engine import ceilings, make_engine, parse_args, static_decode


def micro(dev: torch.device, variants: list[tuple[bool, int]]) -> None:
    """32 layers' o projections at batch 1 replayed from one graph, each after a sleep standing
    in for the attention before it, with the layer's weights prefetched beside the sleep or not."""
    props = torch.cuda.get_device_properties(dev)
    print(json.dumps({"part": "micro", "l2_bytes": props.L2_cache_size, "sms": props.multi_processor_count}))
    ws = [torch.randn(4096, 4096, dtype=torch.bfloat16, device=dev) / 64 for _ in range(32)]
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream(dev)

    def chain(sleep: int, mm: bool, prefetch: tuple[bool, int] | None) -> None:
        main = torch.cuda.current_stream(dev)
        for w in ws:
            if prefetch is not None:
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    l2_prefetch(w, line=prefetch[0], chunk=prefetch[1])
            if sleep:
                torch.cuda._sleep(sleep)
            if mm:
                x @ w.t()
        if prefetch is not None:
            main.wait_stream(side)

    for sleep in (0, 18000):
        for mm, prefetch in [(False, None), (True, None), *((True, v) for v in variants), (False, variants[0])]:
            us = graph_ms(lambda s=sleep, m=mm, p=prefetch: chain(s, m, p), 20) * 1000 / len(ws)
            name = "none" if prefetch is None else f"{'line' if prefetch[0] else 'bulk'}:{prefetch[1]}"
            print(json.dumps({"part": "micro", "sleep_cycles": sleep, "o_proj": mm, "prefetch": name,
                              "us_per_layer": us}), flush=True)  # fmt: skip


def engine_part(argv: list[str], plans: list[str], static: str, variants: list[tuple[bool, int]]) -> None:
    args = parse_args(["--out", "/dev/null", *argv])
    engine, cfg, stop = make_engine(args)
    copy_bw = ceilings(engine.device)["copy_bw_GBps"] * 1e9
    old = engine.runner.graphs
    assert old is not None
    for spec, (line, chunk) in [(p, v) for p in plans for v in (variants if p else variants[:1])]:
        engine.runner.graphs = None
        torch.cuda.empty_cache()
        plan = parse_plan(spec)
        graphs = DecodeGraphs(engine.runner.model, old.req_table, old.dummy_slot, old.dummy_row, old.max_context,
                              old.buckets, engine.device, l2_plan=plan, l2_max_batch=old.buckets[-1])  # fmt: skip
        if graphs.l2 is not None:
            graphs.l2.line, graphs.l2.chunk = line, chunk
        engine.runner.graphs = graphs
        for shape in static.split(","):
            b, c = (int(v) for v in shape.split("x"))
            row = static_decode(engine, cfg, b, c, args.static_steps, copy_bw)
            print(
                json.dumps({"part": "engine", "plan": spec or "none", "line": line, "chunk": chunk, **row}), flush=True
            )
    stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="micro,engine")
    ap.add_argument("--static", default="1x1024,4x1024,16x1024,64x1024")
    ap.add_argument("--plans", default=";o=all;o=all,gate_up=16M,down=16M,qkv=16M;")
    ap.add_argument("--variants", default="bulk:4096", help="how to prefetch: bulk|line:<bytes a lane asks for>,...")
    args, rest = ap.parse_known_args()
    dev = torch.device("cuda")
    variants = [(v.split(":")[0] == "line", int(v.split(":")[1])) for v in args.variants.split(",")]
    if "micro" in args.parts:
        micro(dev, variants)
    if "engine" in args.parts:
        engine_part(rest, args.plans.split(";"), args.static, variants)


if __name__ == "__main__":
    main()
