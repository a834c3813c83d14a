"""The serving benchmark in one job: the whole stack on this machine's GPU, then the engine alone.

    python tools/bench_pipeline.py --out-dir DIR [--requests 2000] [--rates 4,16,32]
        [--online-requests 300] [--low-load 20] [--side-by-side 300] [--redis-server PATH] [--fronts 2]
        [--parts lowload,side,offline,online] (and lowload-aiohttp)

1. Writes a Llama-3-8B-shaped model directory (config and a synthetic 128k tokenizer;
   the worker draws random weights on the GPU) and starts redis-server and the four
   services as processes (tools/stack.py), the worker on CUDA and --fronts front-end
   processes sharing the HTTP port (a front end is one Python process: at thousands of
   streamed tokens a second, one alone becomes the limit).
2. Runs tools/benchmark_serving.py against it: one request at a time (low load; and again
   through aiohttp, lowload-aiohttp), the first --side-by-side requests all at once (for the
   Hugging Face peer's ratio), the full --requests all at once (offline), then Poisson
   arrivals at each of --rates, with a plot (--parts picks some of these five).
3. Stops the stack and runs tools/benchmark_engine.py on the same workload: the engine
   alone, no Redis and no HTTP, offline and at low load (those of the two that ran).
Everything goes to DIR/pipeline.json (and each part's own JSON) and a summary is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import benchmark_engine, benchmark_serving, make_bench_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions

WORKER_ARGS = [
    "--device",
    "cuda",
    "--random-weights",
    "true",
    "--running-max-req-size",
    "2048",
    "--batch-max-tokens",
    "16384",
]
ROUTER_ARGS = ["--running-max-req-size", "4096", "--max-waiting", "20000"]
PARTS = ("lowload", "lowload-aiohttp", "side", "offline", "online")
DEFAULT_PARTS = "lowload,side,offline,online"  # lowload-aiohttp on request: it makes a full job too long for one call


def serving(url: str, out: str, **kw) -> dict | list:
    argv = ["--url", url, "--out", out, "--quiet"]
    for k, v in kw.items():
        flag = f"--{k.replace('_', '-')}"
        argv += [flag] if v is True else [flag, str(v)]
    results = benchmark_serving.main(argv)
    return results if len(results) > 1 else results[0]


def paired_added(pipeline: dict, engine: dict) -> float | None:
    """The median over requests of the pipeline's TTFT less the engine alone's for the same
    prompt: each request is paired with itself, so the prompt's length (the prefill's time)
    drops out, which the difference of the two medians keeps."""
    pairs = zip(pipeline.get("per_request_ttft_ms") or [], engine.get("ttft_each_ms") or [], strict=False)
    diffs = [p - e for p, e in pairs if p is not None]
    return statistics.median(diffs) if diffs else None


def worker_figures(metrics_url: str) -> dict[str, float]:
    """The worker's step counters from its /metrics (docs/metrics.md): steps, step seconds, tokens."""
    wanted = {
        "lightstream_worker_steps_total": "steps",
        "lightstream_worker_step_seconds_sum": "step_seconds",
        "lightstream_worker_prefill_tokens_total": "prefill_tokens",
        "lightstream_worker_decode_tokens_total": "decode_tokens",
    }
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(metrics_url, timeout=10).text):
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] = sample.value
    return out


def figures_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    out = {k: after[k] - before.get(k, 0.0) for k in after}
    if out.get("steps"):
        out["ms_per_step"] = 1000 * out["step_seconds"] / out["steps"]
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, help="pipeline.json, engine_alone.json and the plot")
    ap.add_argument("--work-dir", default="/tmp/lightstream-bench", help="the model directory, logs, part files")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rates", default="4,16,32")
    ap.add_argument("--online-requests", type=int, default=300)
    ap.add_argument("--low-load", type=int, default=20)
    ap.add_argument("--side-by-side", type=int, default=300)
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--fronts", type=int, default=2, help="front-end processes sharing the port (SO_REUSEPORT)")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--parts", default=DEFAULT_PARTS, help=f"some of {','.join(PARTS)}")
    args = ap.parse_args(argv)
    args.part_list = args.parts.split(",")
    if unknown := set(args.part_list) - set(PARTS):
        ap.error(f"unknown parts {sorted(unknown)}: choose from {','.join(PARTS)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    parts = args.part_list
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    res: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "worker_args": WORKER_ARGS,
        "router_args": ROUTER_ARGS,
        "fronts": args.fronts,
    }
    path = os.path.join(args.out_dir, "pipeline.json")

    def save() -> None:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    _pipeline_parts(args, parts, res, save)
    if not args.skip_engine:
        _engine_alone(args, parts, res)
        save()
    keys = (
        "pipeline_over_engine",
        "low_load_ttft_added_ms",
        "low_load_ttft_added_paired_ms",
        "low_load_aiohttp_ttft_added_ms",
    )
    print(json.dumps({k: res.get(k) for k in keys}), flush=True)
    return res


def _pipeline_parts(args: argparse.Namespace, parts: list[str], res: dict, save: Callable[[], None]) -> None:
    """The whole stack on the bench model: each asked-for part, its figures into res."""
    model_dir = os.path.join(args.work_dir, "model")
    make_bench_model.main(["--out", model_dir])
    redis = RedisServer(binary=args.redis_server).start()
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    stack = Stack(
        StackOptions(
            model_dir=model_dir,
            redis_url=redis.url,
            port=free_port(),
            log_dir=os.path.join(args.work_dir, "logs"),
            worker_args=[*WORKER_ARGS, "--metrics-port", str(metrics_port)],
            router_args=ROUTER_ARGS,
            fronts=args.fronts,
        )
    )
    try:
        t = time.perf_counter()
        stack.start()
        stack.wait_ready(timeout_s=600)
        res["stack_ready_s"] = time.perf_counter() - t
        print("stack ready in", round(res["stack_ready_s"], 1), "s", flush=True)
        _serve_parts(args, parts, stack.url, metrics_url, res, save)
    finally:
        stack.stop()
        redis.stop()


def _serve_parts(
    args: argparse.Namespace, parts: list[str], url: str, metrics_url: str, res: dict, save: Callable[[], None]
) -> None:
    d = args.work_dir
    serving(url, os.path.join(d, "warmup.json"), requests=16)
    if "lowload" in parts:
        out = os.path.join(d, "low_load.json")
        res["low_load"] = serving(url, out, requests=args.low_load, max_concurrency=1, per_request=True)
        save()
    if "lowload-aiohttp" in parts:  # the same through aiohttp, vLLM's client: what the client's own time adds
        out = os.path.join(d, "low_load_aiohttp.json")
        res["low_load_aiohttp"] = serving(
            url, out, requests=args.low_load, max_concurrency=1, client="aiohttp", per_request=True
        )
        save()
    if "side" in parts:
        res["side_by_side"] = serving(url, os.path.join(d, "side_by_side.json"), requests=args.side_by_side)
        save()
    if "offline" in parts:
        before = worker_figures(metrics_url)
        res["offline"] = serving(url, os.path.join(d, "offline.json"), requests=args.requests)
        res["offline"]["worker"] = figures_between(before, worker_figures(metrics_url))  # its steps in the part
        save()
    if "online" in parts:
        plot = os.path.join(args.out_dir, "latency_vs_rate.png")
        out = os.path.join(d, "online.json")
        res["online"] = serving(url, out, requests=args.online_requests, rates=args.rates, plot=plot)
        save()


def _engine_alone(args: argparse.Namespace, parts: list[str], res: dict) -> None:
    """The engine alone on the same parts, in the same job, and the pipeline's figures against it."""
    engine_parts = ["ceilings"] + [p for p in ("lowload", "offline") if p in parts]
    if "lowload-aiohttp" in parts and "lowload" not in parts:
        engine_parts.insert(1, "lowload")
    if len(engine_parts) == 1:
        return
    side = args.side_by_side if "side" in parts else 0
    out = os.path.join(args.out_dir, "engine_alone.json")
    flags = {
        "--out": out,
        "--parts": ",".join(engine_parts),
        "--requests": args.requests,
        "--low-load-requests": args.low_load,
        "--side-by-side": side,
        "--running-max-req-size": 2048,
    }
    engine = benchmark_engine.main([str(x) for item in flags.items() for x in item])
    res["engine_alone"] = {k: engine.get(k) for k in ("ceilings", "engine", "low_load", "side_by_side", "offline")}
    if "offline" in parts:
        res["pipeline_over_engine"] = res["offline"]["req_per_s"] / engine["offline"]["req_per_s"]
    for part, key in (("lowload", "low_load"), ("lowload-aiohttp", "low_load_aiohttp")):
        if part in parts:
            added = res[key]["ttft_ms"]["median"] - engine["low_load"]["ttft_ms"]["median"]
            res[f"{key}_ttft_added_ms"] = added
            res[f"{key}_ttft_added_paired_ms"] = paired_added(res[key], engine["low_load"])


if __name__ == "__main__":
    main()
