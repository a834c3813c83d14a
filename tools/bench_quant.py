"""bf16 against FP8 weights and FP8 KV in one job: tools/benchmark_engine.py's parts, and prefill
throughput on long prompts, for each variant on engines built from the same random draws.

    python tools/bench_quant.py --out FILE.json [--variants bf16,kv-fp8,fp8,fp8+kv-fp8]
        [--prefill 16x4096] [any tools/benchmark_engine.py flag: --parts, --static, --requests, --shape, ...]

Variants: bf16 (bf16 weights, bf16 KV), kv-int8, kv-fp8 (bf16 weights, a quantized KV pool),
fp8 (--quantization fp8: e4m3 projections, bf16 KV) and fp8+kv-fp8, fp8+kv-int8. The bf16-weight
variants run first: the FP8 ones quantize the shared random weights in place, and the bf16
tensors' memory then goes to their KV pools. Each variant sizes its own KV pool (FP8 weights
and KV leave room for more tokens). Parts: benchmark_engine's base parts (static decode steps
with their bandwidth floors, lowload, offline) on one engine per variant, then prefill: --prefill
N x L prompts of L random tokens each, one output token, all at once: prompt tokens per second.
Writes by_variant (each variant's figures and engine) and over_bf16 (each variant's ratio to the
first: decode ms per step, offline requests/s, prefill tokens/s) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from services.worker.engine import Engine
from tools import benchmark_engine
from tools.bench_prefix import request, warm
from tools.engine_factory import EngineFactory
from tools.workload import random_prompts

# variant -> (--quantization, --kv-dtype)
VARIANTS = {
    "bf16": ("none", "auto"),
    "kv-int8": ("none", "int8"),
    "kv-fp8": ("none", "fp8"),
    "fp8": ("fp8", "auto"),
    "fp8+kv-int8": ("fp8", "int8"),
    "fp8+kv-fp8": ("fp8", "fp8"),
}


def prefill(engine: Engine, vocab: int, spec: str) -> dict:
    """N x L: N prompts of L tokens at once, one output token each -> prompt tokens per second."""
    n, length = (int(x) for x in spec.split("x"))
    warm(engine, vocab)
    engine.add(request("prefill-warm", random_prompts([length], vocab, seed=7)[0], 1))
    benchmark_engine.drain(engine)  # the long prompt's chunk shapes compiled and captured untimed
    prompts = random_prompts([length] * n, vocab, seed=8)
    benchmark_engine.sync(engine.device)
    t = time.perf_counter()
    for k, ids in enumerate(prompts):
        engine.add(request(f"p{k}", ids, 1))
    steps, _ = benchmark_engine.drain(engine)
    benchmark_engine.sync(engine.device)
    dt = time.perf_counter() - t
    return {"prompts": n, "prompt_len": length, "seconds": dt, "steps": steps, "prompt_tok_per_s": n * length / dt}


def ratios(base: dict, other: dict) -> dict:
    """other over base: decode step time by batch x context, offline requests/s, prefill tokens/s."""
    out: dict = {}
    for a, b in zip(base.get("static", []), other.get("static", []), strict=False):
        out[f"decode_ms_{a['batch']}x{a['context']}"] = b["ms_per_step"] / a["ms_per_step"]
    for part, key in (("offline", "req_per_s"), ("prefill", "prompt_tok_per_s")):
        if part in base and part in other:
            out[f"{part}_{key}"] = other[part][key] / base[part][key]
    if "engine" in base and "engine" in other:
        out["kv_capacity_tokens"] = other["engine"]["kv_capacity_tokens"] / base["engine"]["kv_capacity_tokens"]
    return out


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="bf16,kv-fp8,fp8,fp8+kv-fp8", help=f"from {', '.join(VARIANTS)}")
    ap.add_argument("--prefill", default="16x4096", help="N x L prompts for the prefill part; empty: none")
    own, rest = ap.parse_known_args(argv)
    names = own.variants.split(",")
    if unknown := [v for v in names if v not in VARIANTS]:
        ap.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    own.names = sorted(names, key=lambda v: VARIANTS[v][0] != "none")  # bf16 weights first, in the given order
    args = benchmark_engine.parse_args(rest)
    if args.cache_settings != ["on"] or any(
        p not in (*benchmark_engine.BASE_PARTS, "ceilings") for p in args.part_list
    ):
        ap.error("bench_quant runs benchmark_engine's base parts (ceilings, static, lowload, offline), cache on")
    return own, args


def main(argv: list[str] | None = None) -> dict:
    own, args = parse_args(argv)
    res: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "args": vars(args),
        "variants": own.names,
    }
    if torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name(0)

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if "ceilings" in args.part_list:
        res["ceilings"] = benchmark_engine.ceilings(device)
        print("ceilings", json.dumps(res["ceilings"]), flush=True)
    copy_bw = res.get("ceilings", {}).get("copy_bw_GBps", 0.0) * 1e9
    factory = EngineFactory(args)
    for name in own.names:
        args.quantization, args.kv_dtype = VARIANTS[name]
        factory.capacity = args.max_total_token_num  # each variant's pool sized from its own free memory
        out = res.setdefault("by_variant", {}).setdefault(name, {})
        built = factory.build(cache_on=True)
        out["engine"] = {**built.info, "quantization": args.quantization, "kv_dtype": args.kv_dtype}
        print(name, "engine", json.dumps(out["engine"]), flush=True)
        benchmark_engine.base_parts(built, args, out, save, copy_bw)
        if own.prefill:
            out["prefill"] = prefill(built.engine, built.model_cfg.vocab_size, own.prefill)
            print(name, "prefill", json.dumps(out["prefill"]), flush=True)
        factory.release(built)
        save()
    first = own.names[0]
    res["over_" + first] = {v: ratios(res["by_variant"][first], res["by_variant"][v]) for v in own.names[1:]}
    print("over_" + first, json.dumps(res["over_" + first]), flush=True)
    save()
    return res


if __name__ == "__main__":
    main()
