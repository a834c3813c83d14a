"""Where a step's time goes: per-kernel device time of a decode step (torch.profiler), and
the host's time in an eager prefill forward (cProfile).

    python tools/profile_decode.py --out FILE.json [--shape llama3-8b] [--cases 1x1024,64x1024,256x1024]
        [--prefills 1x209,4x209] [--quantization none|fp8|awq|gptq] [--fp8-lm-head] [--kv-dtype auto|int8|fp8]

For each batch x context it builds requests in the decode state (KV filled by a real
prefill), then profiles eager decode forwards and reports the device time per kernel
name, summed over the step, next to the graph-replay step time. For each --prefills
batch x prompt length it times eager prefill forwards on the host (wall) and on the device
(CUDA events), and lists the Python functions the host spends that time in.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from collections import defaultdict

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.profiler import ProfilerActivity, profile

from services.worker.batch_builder import build_batch
from services.worker.build import build_engine
from services.worker.forward_batch import ForwardBatch
from services.worker.models import int4_formats
from services.worker.models.bench_shapes import SHAPES
from services.worker.models.fp8_weight import quantize_layers_
from services.worker.models.registry import random_weights
from services.worker.request import Req
from services.worker.scheduler import StepPlan
from shared.config import WorkerConfig
from shared.messages import GenerateReq, SamplingParams
from shared.model_config import ModelConfig
from tools.engine_factory import INT4
from tools.workload import random_prompts


def decode_batch(engine, reqs: list[Req]):
    slots = torch.cat([engine.kv.allocate(r, 1) for r in reqs])
    plan = StepPlan(decodes=list(reqs), decode_slots=slots)
    return build_batch(plan, engine.kv.table.table, engine.device)  # replayed as is: the context stays put


def decode_state(engine, cfg: ModelConfig, batch: int, context: int, seed: int = 7) -> tuple[list[Req], ForwardBatch]:
    """batch requests with context tokens each in the pool (real prefills) -> (the requests, a
    decode batch of them, to replay as is). Release the requests' KV when done."""
    reqs = []
    for k, ids in enumerate(random_prompts([context] * batch, cfg.vocab_size, seed=seed)):
        msg = GenerateReq(f"p{k}", "p", "p", ids, SamplingParams(max_new_tokens=4, ignore_eos=True), 0.0, 0.0)
        req = Req(msg, k)
        plan = StepPlan(extends=[(req, context)], extend_slots=[engine.kv.allocate(req, context)], new_rows=[req])
        engine.runner.forward(build_batch(plan, engine.kv.table.table, engine.device))
        req.kv_len = context
        req.tokens.append(ids[-1])
        reqs.append(req)
    return reqs, decode_batch(engine, reqs)


def profile_case(engine, cfg: ModelConfig, batch: int, context: int) -> dict:
    reqs, batch_t = decode_state(engine, cfg, batch, context)
    model = engine.runner.model
    for _ in range(3):
        model.forward(batch_t)
    torch.cuda.synchronize()
    steps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            model.forward(batch_t)
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for evt in prof.key_averages():
        if evt.device_time_total > 0:
            per_kernel[evt.key[:90]] += evt.device_time_total / steps / 1000.0
            counts[evt.key[:90]] += evt.count // steps
    total = sum(per_kernel.values())
    eager_wall = _time(lambda: model.forward(batch_t))
    graph_wall = _time(lambda: engine.runner.forward(batch_t)) if engine.runner.graphs is not None else None
    for r in reqs:
        engine.kv.release(r)
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:25]
    return {
        "batch": batch,
        "context": context,
        "device_ms_per_step": total,
        "eager_wall_ms": eager_wall,
        "graph_wall_ms": graph_wall,
        "kernels_per_step": sum(counts.values()),
        "top_kernels_ms": [[name, round(ms, 4), counts[name]] for name, ms in top],
    }


def host_profile(engine, cfg: ModelConfig, batch: int, length: int, reps: int = 10) -> dict:
    """An eager prefill forward of batch prompts of length tokens: host wall time, device time,
    and the functions the host spent it in (cProfile, own time per forward)."""
    prompts = random_prompts([length] * batch, cfg.vocab_size, seed=11)
    reqs = [
        Req(GenerateReq(f"h{k}", "p", "p", ids, SamplingParams(max_new_tokens=4, ignore_eos=True), 0.0, 0.0), k)
        for k, ids in enumerate(prompts)
    ]
    slots = [engine.kv.allocate(r, length) for r in reqs]
    plan = StepPlan(extends=[(r, length) for r in reqs], extend_slots=slots, new_rows=list(reqs))
    fb = build_batch(plan, engine.kv.table.table, engine.device)
    model = engine.runner.model
    wall = _time(lambda: model.forward(fb), reps)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        model.forward(fb)
    end.record()
    torch.cuda.synchronize()
    device = start.elapsed_time(end) / reps
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        model.forward(fb)
    launch = 1000 * (time.perf_counter() - t) / reps  # host time to queue a forward, the device not waited for
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        model.forward(fb)
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:30]
    top = [
        [f"{os.path.basename(fn)}:{line}:{name}", ncalls // reps, round(1000 * tottime / reps, 4)]
        for (fn, line, name), (_, ncalls, tottime, _, _) in rows
    ]
    for r in reqs:
        engine.kv.release(r)
    return {
        "batch": batch,
        "length": length,
        "wall_ms": wall,
        "device_ms": device,
        "host_queue_ms": launch,
        "top_host_functions_ms": top,
    }


def _time(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t) / reps


def _report(row: dict, top: str, lines: int) -> dict:
    """Print a case's figures and its top entries (name, count, ms); -> the row."""
    print(json.dumps({k: v for k, v in row.items() if k != top}), flush=True)
    for entry in row[top][:lines]:
        name, count, ms = (entry[0], entry[2], entry[1]) if top == "top_kernels_ms" else entry
        print(f"   {ms:8.4f} ms  x{count:<5d} {name}", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--cases", default="1x1024,64x1024,256x1024")
    ap.add_argument("--prefills", default="1x209,4x209,1x1024", help="eager prefill batch x length, host-profiled")
    ap.add_argument("--gemm-search", type=int, default=1, help="0: decode graphs use PyTorch's matmul libraries only")
    ap.add_argument("--fold-norms", type=int, default=1, help="0: norms kept apart from the weights (no decode_folded)")
    ap.add_argument("--quantization", choices=("none", "fp8", *INT4), default="none", help="the projections' format")
    ap.add_argument("--fp8-lm-head", action="store_true", help="with fp8, awq or gptq: the output layer in FP8 too")
    ap.add_argument("--kv-dtype", default="auto", help="the KV pool's format: auto (the model's dtype), int8 or fp8")
    args = ap.parse_args(argv)
    cfg = ModelConfig.from_dict(SHAPES[args.shape])
    device = torch.device("cuda")
    weights = random_weights(cfg, torch.bfloat16, device)
    if args.quantization == "fp8":
        quantize_layers_(weights.layers)
    elif args.quantization in INT4:
        int4_formats.quantize_layers_(weights.layers, args.quantization)
    engine = build_engine(
        WorkerConfig(
            model_dir="(random)",
            max_total_token_num=300_000,
            running_max_req_size=512,
            gemm_search=bool(args.gemm_search),
            fold_norms=bool(args.fold_norms),
            quantization="fp8" if args.quantization == "fp8" else "none",
            fp8_lm_head=args.fp8_lm_head,
            kv_dtype=args.kv_dtype,
        ),
        weights=weights,
        model_cfg=cfg,
    )
    out = []
    for spec in filter(None, args.prefills.split(",")):
        b, n = (int(x) for x in spec.split("x"))
        out.append(_report(host_profile(engine, cfg, b, n), "top_host_functions_ms", 18))
    for spec in filter(None, args.cases.split(",")):
        b, c = (int(x) for x in spec.split("x"))
        row = _report(profile_case(engine, cfg, b, c), "top_kernels_ms", 12)
        graphs = engine.runner.graphs
        if graphs is not None:  # what each projection of this batch's bucket was captured with
            row["gemms"] = graphs.described_blas(b)
            print(json.dumps({"batch": b, "gemms": row["gemms"]}), flush=True)
        out.append(row)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
