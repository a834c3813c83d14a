"""Do cuBLAS's decode products wait for the kernel before them when their graph edge is programmatic,
and what does a decode step gain if they start early?

1. For each projection of the engine's decode graphs at the given batches, with the library or
   algorithm the graph was captured with: a graph of [a kernel that writes the product's input
   after a delay] -> [the product], its edge rewritten to a programmatic one (graph_edges.py).
   If the product's kernels wait (griddepcontrol.wait) the output equals the plain graph's;
   if not they read the old input. A Triton copy that does not wait is the control: with the
   same edge it must read the old input, or the rewrite did not let it start early.
2. The engine's decode graphs at those batches captured again with every edge into a kernel
   that waited in 1 rewritten, then static decode steps (as benchmark_engine.py's `static`),
   alternating with the graphs as captured. The two graphs' logits on one input are compared.
   With --racy the edges into products that did not wait are rewritten too: their steps run
   with stale inputs, and time only a bound on what starting early could give.

    python3 tools/diag/blas_pdl.py --batches 1,64 --rounds 2 --racy --out $OUT/blas_pdl.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda.utils import globaltimer

from services.worker.blas_choice import describe, run
from tools.benchmark_engine import make_engine, parse_args, static_decode
from tools.diag.graph_edges import PORT_LAUNCH_ORDER, PORT_PROGRAMMATIC, GraphEdges


@triton.jit
def _late_write(x_ptr, n, delay_ns, BLOCK: tl.constexpr):
    t0 = globaltimer()
    t = t0
    while t - t0 < delay_ns:
        t = globaltimer()
    for i in range(0, n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.full((BLOCK,), 1.0, tl.float32).to(x_ptr.dtype.element_ty), mask=offs < n)


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _graph(fn, port: int | None) -> tuple[torch.cuda.CUDAGraph, list[tuple[str, str]], list[str]]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g, stream=s):
        fn()
    edges = GraphEdges(g.raw_cuda_graph())
    names = [n for n in map(edges.kernel_name, edges.nodes()) if n]
    done = edges.make_programmatic(lambda a, b: a.startswith("_late_write"), port) if port is not None else []
    g.instantiate()
    return g, done, names


def _late_then(consume, x: torch.Tensor, out: torch.Tensor, reset: torch.Tensor, port: int | None, delay_us: float):
    """(out after one replay of [late write of x] -> consume, kernels, edges rewritten, µs a replay)."""

    def fn() -> None:
        _late_write[(1,)](x, x.numel(), int(delay_us * 1000), BLOCK=1024)
        consume()

    g, done, names = _graph(fn, port)
    x.zero_()
    out.copy_(reset)
    g.replay()
    torch.cuda.synchronize()
    got = out.clone()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        g.replay()
    end.record()
    end.synchronize()
    return got, names, done, start.elapsed_time(end) * 1000 / 20


def wait_test(model, graphs, batches: list[int], delay_us: float) -> tuple[list[dict], set[str], set[str]]:
    """(one row per test, the products' kernels that waited, those that did not)."""
    rows, passed, failed = [], set(), set()
    projections = model.projections()
    x0 = torch.zeros(1, 4096, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x0)
    for port in (PORT_LAUNCH_ORDER, PORT_PROGRAMMATIC):  # the control: a copy that does not wait
        got, _, done, us = _late_then(lambda: _copy[(4,)](x0, y, x0.numel(), BLOCK=1024), x0, y, y * 0 + 2, port,
                                      delay_us)  # fmt: skip
        rows.append({"test": "control", "port": port, "edges": len(done), "read_new_input": bool((got == 1).all()),
                     "read_old_input": bool((got == 0).all()), "us": us})  # fmt: skip
    for bs in batches:
        adds = model.accumulating(bs)
        for name, choice in graphs.blas[bs].items():
            wt = projections[name][0]
            x = torch.zeros(bs, wt.shape[1], dtype=wt.dtype, device=wt.device)
            out = torch.empty(bs, wt.shape[0], dtype=wt.dtype, device=wt.device)
            reset = torch.randn_like(out)
            acc = name in adds

            def product(x=x, wt=wt, out=out, choice=choice, acc=acc) -> None:
                run(choice, graphs.lt, x, wt, out, acc)

            ref, names, _, us_plain = _late_then(product, x, out, reset, None, delay_us)
            for port in (PORT_LAUNCH_ORDER, PORT_PROGRAMMATIC):
                got, _, done, us = _late_then(product, x, out, reset, port, delay_us)
                ok = bool(torch.equal(got, ref)) and len(done) > 0
                blas = [n for n in names if not n.startswith("_late_write")]
                # only the launch-order port starts the product before the writer is done (the
                # control shows it); right results behind the other port prove nothing
                if ok and port == PORT_LAUNCH_ORDER:
                    passed.update(blas)
                if not ok and port == PORT_LAUNCH_ORDER:
                    failed.update(blas)
                rows.append({"test": "product", "batch": bs, "projection": name, "choice": describe(choice),
                             "accumulate": acc, "port": port, "kernels": blas, "edges": done, "equal": ok,
                             "max_diff": float((got.float() - ref.float()).abs().max()), "us": us,
                             "us_plain": us_plain})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    return rows, passed - failed, failed


def recapture(graphs, bs: int, pick, port: int) -> list[tuple[str, str]]:
    """Captures bucket bs's decode graph again (keeping it, to rewrite edges first) and puts it in place."""
    model = graphs.model
    model.blas = graphs.blas[bs]
    try:
        batch = graphs._batch(bs)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model.forward(batch)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g, stream=s):
            logits = model.forward(batch)
    finally:
        model.blas = None
    done = GraphEdges(g.raw_cuda_graph()).make_programmatic(pick, port) if pick is not None else []
    g.instantiate()
    graphs.graphs[bs], graphs.logits[bs] = g, logits
    return done


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--delay-us", type=float, default=30.0)
    ap.add_argument("--ports", default="launch_order,programmatic")
    ap.add_argument(
        "--racy",
        action="store_true",
        help="rewrite the edges into products that do not wait too (a bound; their logits differ)",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    eargs = parse_args(["--out", "/dev/null", "--running-max-req-size", str(max(batches)), "--mem-fraction", "0.85"])
    engine, cfg, _ = make_engine(eargs)
    graphs, model = engine.runner.graphs, engine.runner.model
    res: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args)}
    res["wait_test"], passed, failed = wait_test(model, graphs, batches, args.delay_us)
    res["kernels_that_wait"], res["kernels_that_do_not"] = sorted(passed), sorted(failed)
    print("wait", json.dumps(res["kernels_that_wait"]), "do not", json.dumps(res["kernels_that_do_not"]), flush=True)
    if args.racy:  # a bound, not a result: products that do not wait, started early, read stale inputs
        passed = passed | failed
    ports = {"launch_order": PORT_LAUNCH_ORDER, "programmatic": PORT_PROGRAMMATIC}
    pick = lambda a, b: b in passed
    res["steps"], res["edges"], res["logits_equal"] = [], {}, {}
    for bs in batches:  # one input, both graphs: the logits must agree bit for bit
        recapture(graphs, bs, None, 0)
        graphs.graphs[bs].replay()
        ref = graphs.logits[bs].clone()
        for pname in args.ports.split(","):
            done = recapture(graphs, bs, pick, ports[pname])
            graphs.graphs[bs].replay()
            res["logits_equal"][f"{bs}/{pname}"] = bool(torch.equal(graphs.logits[bs], ref))
            pairs: dict[str, int] = {}
            for a, b in done:
                key = f"{a[:40]} -> {b[:40]}"
                pairs[key] = pairs.get(key, 0) + 1
            res["edges"][f"{bs}/{pname}"] = pairs
    print("logits_equal", json.dumps(res["logits_equal"]), flush=True)
    print("edges", json.dumps(res["edges"]), flush=True)
    for r in range(args.rounds):
        for pname in ["plain", *args.ports.split(",")]:
            for bs in batches:
                recapture(graphs, bs, None if pname == "plain" else pick, ports.get(pname, 0))
            for bs in batches:
                row = static_decode(engine, cfg, bs, args.context, args.steps, 0.0)
                row = {"round": r, "mode": pname, "batch": bs, "ms_per_step": row["ms_per_step"]}
                res["steps"].append(row)
                print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
