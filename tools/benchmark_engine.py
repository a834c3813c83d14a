"""Benchmark the engine alone (no Redis, no HTTP) on the fixed workload and at static shapes.

    python tools/benchmark_engine.py --out FILE.json [--shape llama3-8b] [--parts ceilings,static,offline]
        [--requests 2000] [--static 1x1024,64x1024,256x1024] [--kv-dtype auto|int8|fp8] [--model-dir DIR]
        [--quantization none|fp8|awq|gptq] [--fp8-lm-head]
        [--prompt-cache on|off|on,off] [--shared-prefix-rate 16]

With --model-dir the weights come from that directory; otherwise they are random, on the
device, at --shape (nothing can be downloaded). Parts:
  ceilings  copy bandwidth and bf16 matmul rate, measured here (the roofline's two numbers)
  static    decode step time at batch x context, the engine's real loop timed in steady state,
            next to the bandwidth floor (weights plus KV read once at the measured copy rate)
  offline   the fixed ShareGPT-shaped workload, all requests at once, ignore_eos, max_new_tokens
            = the output length: requests/s and tokens/s
  lowload   the workload's first requests one at a time: time to first token and per output token
  shared_prefix, shared_prefix_rate, multi_turn
            the prompt cache's workloads (tools/bench_prefix.py), each on an engine of its own so
            that it starts with nothing cached: requests/s, output tokens/s, the hit rate, and
            time to first token from each request's arrival
--prompt-cache on,off runs every part with the prompt cache on, then again on engines built
with it off (the same weights and KV pool size), and records each setting's figures under
by_prompt_cache and the ratios under on_over_off; with one setting the figures are at the top
level. The prompt-cache workloads' sizes are flags (--shared-prefix-groups, ...; see --help).
On CUDA the engine runs the worker service's start-up warm-up first (services/worker/warmup.py),
so neither it nor the pipeline pays kernel compiles inside a timed part.
--tp N runs the engine as a tensor-parallel group of N ranks (one process per GPU, as the
worker service does). --shard I/N runs only every N-th request of the offline workload
from the I-th, so that N processes, one per GPU, make N data-parallel groups; with
--barrier DIR they start the timed run together (each reports its start and end time).
Prints a summary and writes everything to --out as JSON. tools/bench_quant.py runs these parts
for bf16, FP8 weights and FP8 KV in one job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from services.worker.engine import Engine
from services.worker.models.bench_shapes import SHAPES
from shared.model_config import ModelConfig
from tools import bench_prefix, bench_workloads
from tools.bench_prefix import request, warm
from tools.engine_factory import INT4, Built, EngineFactory, projection_bytes
from tools.workload import random_prompts, sharegpt_shaped

BASE_PARTS = ("static", "lowload", "offline")  # run on one engine, in this order
PARTS = ("ceilings", *BASE_PARTS, *bench_prefix.PARTS)
SUMMARY = ("completed", "failed", "req_per_s", "output_tok_per_s", "hit_rate", "ttft_ms")  # printed per part


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ceilings(device: torch.device) -> dict:
    """Copy bandwidth (bytes read + written) and bf16 matmul rate, as the peer measures them."""
    n = 4 * 1024**3 if device.type == "cuda" else 64 * 1024**2
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(device)
    t = time.perf_counter()
    reps = 20 if device.type == "cuda" else 2
    for _ in range(reps):
        y.copy_(x)
    sync(device)
    copy = 2 * n * reps / (time.perf_counter() - t)
    del x, y
    m = 8192 if device.type == "cuda" else 512
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(m, m, dtype=dtype, device=device)
    b = torch.randn_like(a)
    for _ in range(3):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return {"copy_bw_GBps": copy / 1e9, "matmul_TFLOPs": 2 * m**3 * 10 / (time.perf_counter() - t) / 1e12}


def shard(items: list, spec: str) -> list:
    """The I-th of N interleaved parts ("I/N"), as a router spreading requests in turn would."""
    i, n = (int(x) for x in spec.split("/"))
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec}: want I/N with 0 <= I < N")
    return items[i::n]


def barrier(directory: str, parties: int, me: str, timeout_s: float = 600.0) -> None:
    """Wait until `parties` processes have said they are ready in `directory`."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, f"ready-{me}"), "w").close()
    deadline = time.monotonic() + timeout_s
    while len([f for f in os.listdir(directory) if f.startswith("ready-")]) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {directory}: not all {parties} processes came")
        time.sleep(0.001)


def drain(engine: Engine, trace: list | None = None) -> tuple[int, int]:
    """Run until idle; -> (steps, output tokens). trace gets (seconds, tokens, decodes) per step."""
    steps = out = 0
    last = time.perf_counter()
    while engine.has_work():
        result = engine.step()
        for _, item in result.items:
            out += len(item.token_ids)
        steps += 1
        if trace is not None:
            now = time.perf_counter()
            trace.append((now - last, result.num_tokens, result.num_decodes))
            last = now
    return steps, out


def step_profile(trace: list[tuple[float, int, int]]) -> dict:
    """Where the offline run's time went: steps with prefill work against decode-only steps by batch size."""
    mixed = [t for t in trace if t[1] > t[2]]
    decode = [t for t in trace if t[1] == t[2] and t[2] > 0]
    bands = [(1, 8), (9, 64), (65, 256), (257, 512), (513, 1024), (1025, 1 << 30)]
    out = {
        "mixed_steps": len(mixed),
        "mixed_seconds": sum(t[0] for t in mixed),
        "mixed_tokens": sum(t[1] for t in mixed),
        "decode_steps": len(decode),
        "decode_seconds": sum(t[0] for t in decode),
    }
    for lo, hi in bands:
        sel = [t for t in decode if lo <= t[2] <= hi]
        if sel:
            out[f"decode_bs_{lo}_{hi}"] = {
                "steps": len(sel),
                "seconds": round(sum(t[0] for t in sel), 3),
                "ms_per_step": round(1000 * sum(t[0] for t in sel) / len(sel), 3),
            }
    return out


def weight_bytes(cfg: ModelConfig, dtype_bytes: int = 2, layer_bytes: float = 0, head_bytes: float = 0) -> int:
    """Bytes of weights a decode step reads: every layer and the output layer (one embedding row
    aside); a mixture of experts' every expert and router row (a batch that routes to them all).
    layer_bytes, head_bytes: the layers' and the output layer's bytes a weight when not dtype_bytes
    (projection_bytes: FP8's, int4's; the output layer in FP8 with --fp8-lm-head)."""
    h, d = cfg.hidden_size, cfg.head_dim
    attention = h * (cfg.num_heads + 2 * cfg.num_kv_heads) * d + cfg.num_heads * d * h + 2 * h
    sparse = (3 * cfg.moe_intermediate_size + 1) * h * cfg.num_experts + 3 * h * cfg.shared_expert_intermediate_size
    mlp = [sparse if cfg.sparse(i) else 3 * h * cfg.intermediate_size for i in range(cfg.num_layers)]
    layers = (layer_bytes or dtype_bytes) * (cfg.num_layers * attention + sum(mlp))
    return int(layers + (head_bytes or dtype_bytes) * cfg.vocab_size * h + dtype_bytes * h)


def static_decode(engine: Engine, cfg: ModelConfig, batch: int, context: int, steps: int, copy_bw: float) -> dict:
    """Decode steps of `batch` requests whose context is about `context` tokens, in steady state."""
    prompts = random_prompts([context] * batch, cfg.vocab_size, seed=batch + context)
    for k, ids in enumerate(prompts):
        engine.add(request(f"s{batch}-{k}", ids, steps + 8))
    # run the prefills (and a couple of decodes) untimed
    while any(not r.decoding for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    sync(engine.device)
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(engine.device)
    ms = 1000 * (time.perf_counter() - t) / steps
    drain(engine)
    layout = engine.runner.model.attn.cache.layout
    kv_read = batch * (context + steps // 2) * layout.bytes_per_token
    # with tensor parallelism each GPU reads its share of the weights (and of the KV heads:
    # the layout is the rank's already), in parallel with the others
    ranks = engine.runner.model.tp.size
    w = engine.runner.model.w
    weights = weight_bytes(cfg, layer_bytes=projection_bytes(w.layers[0].qkv), head_bytes=projection_bytes(w.lm_head))
    floor_ms = 1000 * (weights / ranks + kv_read) / copy_bw if copy_bw else None
    graphs = engine.runner.graphs  # what the step's graph was captured with, to tell two engines' steps apart
    return {
        "batch": batch,
        "context": context,
        "blas": graphs.described_blas(batch) if graphs is not None and graphs.fits(batch) else None,
        "ms_per_step": ms,
        "tokens_per_s": batch * 1000 / ms,
        "bandwidth_floor_ms": floor_ms,
        "fraction_of_floor": (floor_ms / ms) if floor_ms else None,
    }


def offline(engine: Engine, cfg: ModelConfig, n: int, part: str = "", ready: Callable[[], None] | None = None) -> dict:
    """The workload's first n requests all at once (with part "I/N" only that share of them);
    ready is called after the warm-up, just before the clock starts."""
    pairs = sharegpt_shaped(n)
    prompts = random_prompts([i for i, _ in pairs], cfg.vocab_size, seed=1)
    if part:
        pairs, prompts = shard(pairs, part), shard(prompts, part)
    warm(engine, cfg.vocab_size)
    sync(engine.device)
    if ready is not None:
        ready()
    started_unix = time.time()
    t = time.perf_counter()
    for k, (ids, (_, out_len)) in enumerate(zip(prompts, pairs, strict=True)):
        engine.add(request(f"r{k}", ids, out_len))
    trace: list = []
    steps, out_tokens = drain(engine, trace)
    sync(engine.device)
    dt = time.perf_counter() - t
    n = len(pairs)
    in_tokens = sum(i for i, _ in pairs)
    return {
        "requests": n,
        "part": part,
        "started_unix": started_unix,
        "ended_unix": started_unix + dt,
        "seconds": dt,
        "req_per_s": n / dt,
        "output_tok_per_s": out_tokens / dt,
        "total_tok_per_s": (out_tokens + in_tokens) / dt,
        "steps": steps,
        "output_tokens": out_tokens,
        "mean_input": in_tokens / n,
        "mean_output": out_tokens / n,
        "paused_total": engine.scheduler.num_paused_total,
        "held_back_total": engine.scheduler.num_held_back_total,
        "profile": step_profile(trace),
    }


def low_load(engine: Engine, cfg: ModelConfig, n: int) -> dict:
    """One request at a time: time to first token and per output token, as a client of the engine sees them."""
    pairs = sharegpt_shaped(n)
    prompts = random_prompts([i for i, _ in pairs], cfg.vocab_size, seed=1)
    ttft, tpot = [], []
    for k, (ids, (_, out_len)) in enumerate(zip(prompts, pairs, strict=True)):
        start = time.perf_counter()
        engine.add(request(f"l{k}", ids, out_len))
        first = 0.0
        while engine.has_work():
            if any(item.token_ids for _, item in engine.step().items) and not first:
                first = time.perf_counter() - start
        ttft.append(first)
        if out_len > 1:
            tpot.append((time.perf_counter() - start - first) / (out_len - 1))
    return {
        "requests": n,
        "ttft_ms": {"mean": 1000 * sum(ttft) / n, "median": 1000 * sorted(ttft)[n // 2]},
        "ttft_each_ms": [1000 * t for t in ttft],  # in the workload's order, to pair with the pipeline's
        "tpot_ms": {"mean": 1000 * sum(tpot) / len(tpot), "median": 1000 * sorted(tpot)[len(tpot) // 2]},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="ceilings,static,offline")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ap.add_argument("--model-dir", default="")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kv-dtype", default="auto", help="auto, int8 or fp8")
    ap.add_argument(
        "--quantization",
        default="none",
        choices=("none", "fp8", *INT4),
        help="fp8: projections quantized at load; awq, gptq: random weights' projections as int4 (group size 128)",
    )
    ap.add_argument("--fp8-lm-head", action="store_true", help="with fp8, awq or gptq: the output layer in FP8 too")
    ap.add_argument("--max-total-token-num", type=int, default=0)
    ap.add_argument("--mem-fraction", type=float, default=0.9)
    ap.add_argument("--batch-max-tokens", type=int, default=16384)
    ap.add_argument("--running-max-req-size", type=int, default=1024)
    ap.add_argument("--cuda-graph-max-bs", type=int, default=512)
    ap.add_argument("--cuda-graph-max-tokens", type=int, default=2048)
    ap.add_argument("--gemm-search", type=int, default=1, help="0: decode graphs use PyTorch's matmul libraries only")
    ap.add_argument("--fold-norms", type=int, default=1, help="0: norms kept apart from the weights (no decode_folded)")
    ap.add_argument(
        "--decode-inputs",
        type=int,
        default=1,
        help="0: decode-only batches built by the general path (not runtime/graph_inputs.py)",
    )
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--low-load-requests", type=int, default=20)
    ap.add_argument("--side-by-side", type=int, default=0, help="also run the first N requests alone (offline)")
    ap.add_argument("--static", default="1x1024,64x1024,256x1024,64x2048")
    ap.add_argument("--static-steps", type=int, default=40)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (one process per GPU)")
    ap.add_argument("--shard", default="", help="I/N: only the I-th of N interleaved parts of the offline workload")
    ap.add_argument("--barrier", default="", help="directory where the --shard processes meet before the timed run")
    ap.add_argument("--prompt-cache", default="on", help="on, off or on,off: each setting's parts on its own engines")
    ap.add_argument("--shared-prefix-rate", type=float, default=16.0, help="shared_prefix_rate's arrivals a second")
    bench_workloads.add_args(ap)
    args = ap.parse_args(argv)
    args.part_list = args.parts.split(",")
    if unknown := set(args.part_list) - set(PARTS):
        ap.error(f"unknown parts {sorted(unknown)}: choose from {','.join(PARTS)}")
    if args.quantization in INT4 and (args.model_dir or args.tp > 1):
        ap.error(f"--quantization {args.quantization}: random weights on one GPU only (a checkpoint says its own)")
    args.cache_settings = args.prompt_cache.split(",")
    if set(args.cache_settings) - {"on", "off"} or len(set(args.cache_settings)) < len(args.cache_settings):
        ap.error(f"--prompt-cache {args.prompt_cache}: want on, off, on,off or off,on")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    res: dict = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "args": vars(args)}
    if torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name(0)

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if "ceilings" in args.part_list:
        res["ceilings"] = ceilings(device)
        print("ceilings", json.dumps(res["ceilings"]), flush=True)
        save()
    factory = EngineFactory(args)
    settings = args.cache_settings
    for setting in settings:
        # one setting's figures at the top level, as before the prompt cache; two side by side
        out = res if len(settings) == 1 else res.setdefault("by_prompt_cache", {}).setdefault(setting, {})
        run_setting(factory, setting == "on", out, res, save)
    if len(settings) > 1:
        res["on_over_off"] = bench_prefix.on_over_off(res["by_prompt_cache"]["on"], res["by_prompt_cache"]["off"])
        print("on_over_off", json.dumps(res["on_over_off"]), flush=True)
    save()
    return res


def run_setting(factory: EngineFactory, cache_on: bool, out: dict, res: dict, save: Callable[[], None]) -> None:
    """Every asked-for part with the prompt cache on or off: the base parts on one engine, and
    each prompt-cache part on an engine of its own, so it starts with nothing cached."""
    args = factory.args
    copy_bw = res.get("ceilings", {}).get("copy_bw_GBps", 0.0) * 1e9
    if any(p in BASE_PARTS for p in args.part_list):
        built = factory.build(cache_on)
        out["engine"] = built.info
        print("engine", json.dumps(built.info), flush=True)
        base_parts(built, args, out, save, copy_bw)
        factory.release(built)
    for part in (p for p in args.part_list if p in bench_prefix.PARTS):
        built = factory.build(cache_on)
        print(part, "engine", json.dumps(built.info), flush=True)
        figures = bench_prefix.run_part(part, built.engine, built.model_cfg.vocab_size, args)
        out[part] = {"engine": built.info, **figures}
        factory.release(built)
        print(part, json.dumps({k: figures[k] for k in SUMMARY if k in figures}), flush=True)
        save()


def base_parts(built: Built, args: argparse.Namespace, out: dict, save: Callable[[], None], copy_bw: float) -> None:
    engine, model_cfg, parts = built.engine, built.model_cfg, args.part_list
    if "static" in parts:
        out["static"] = []
        for spec in args.static.split(","):
            b, c = (int(x) for x in spec.split("x"))
            row = static_decode(engine, model_cfg, b, c, args.static_steps, copy_bw)
            out["static"].append(row)
            print("static", json.dumps(row), flush=True)
            save()
    if "lowload" in parts:
        out["low_load"] = low_load(engine, model_cfg, args.low_load_requests)
        print("low_load", json.dumps(out["low_load"]), flush=True)
        save()
    if "offline" in parts and args.side_by_side:
        out["side_by_side"] = offline(engine, model_cfg, args.side_by_side)
        print("side_by_side", json.dumps(out["side_by_side"]), flush=True)
        save()
    if "offline" in parts:
        ready = None
        if args.barrier:
            parties = int(args.shard.split("/")[1]) if args.shard else 1
            ready = lambda: barrier(args.barrier, parties, args.shard.replace("/", "-") or "0")
        out["offline"] = offline(engine, model_cfg, args.requests, args.shard, ready)
        print("offline", json.dumps(out["offline"]), flush=True)
        save()


if __name__ == "__main__":
    main()
