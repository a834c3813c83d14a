"""Structured output through the whole pipeline, in one job (issue 48): the fixed workload with
every request under a JSON schema against the same requests unconstrained, on one stack.

    python tools/bench_structured.py --out-dir DIR [--requests 2000] [--low-load 20]
        [--redis-server PATH] [--model-dir DIR --device cpu] [-- more benchmark_serving.py flags]

1. Writes a Llama-3-8B-shaped model directory with its full-vocabulary tokenizer
   (tools/make_bench_model.py; the worker draws random weights) unless --model-dir names one,
   starts redis-server and the four services (tools/stack.py), and sends a short warm-up.
2. Cold: one request per schema of tools/structured_schemas.py, one at a time: each TTFT
   holds its schema's compile, and the worker's log says how long each compile took.
3. Low load, --low-load requests one at a time: under the (now compiled) schemas, then
   unconstrained with the same output lengths; the TTFT medians' difference is the figure.
4. The fixed workload (--requests, all at once): every request under a schema (ignore_eos
   off: a grammar ends its answer), then unconstrained with each request's output length
   from the constrained run (ignore_eos on), so both write the same tokens.
5. Writes DIR/structured.json: each run's benchmark_serving figures, the compile times, and
   constrained over unconstrained for requests/s, output tokens/s and TPOT.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import benchmark_serving, make_bench_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions
from tools.structured_schemas import SCHEMAS

ROUTER_ARGS = ["--running-max-req-size", "4096", "--max-waiting", "20000"]
COMPILED = re.compile(r"grammar compiled: (\w+) of (\d+) characters in ([\d.]+) ms")


def worker_args(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device, "--running-max-req-size", "2048", "--batch-max-tokens", "16384"]
    return out if args.model_dir else [*out, "--random-weights", "true"]


def compile_times(log_path: str) -> list[dict]:
    """Every compile the worker logged, in order: kind, the constraint's length, milliseconds."""
    with open(log_path, errors="replace") as f:
        found = COMPILED.findall(f.read())
    return [{"kind": k, "chars": int(n), "ms": float(ms)} for k, n, ms in found]


class Runs:
    """benchmark_serving against one stack, each run's JSON kept under the output folder."""

    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.common = ["--url", url, "--vocab", str(args.vocab), "--quiet", "--per-request"]

    def __call__(self, name: str, *flags: str) -> tuple[dict, str]:
        out = os.path.join(self.args.out_dir, f"serving-{name}.json")
        (res,) = benchmark_serving.main([*self.common, "--out", out, *flags, *self.args.serving_args])
        print(name, json.dumps({k: res.get(k) for k in ("completed", "failed", "req_per_s", "ttft_ms", "tpot_ms")}))
        return res, out


def over(a: dict, b: dict) -> dict:
    """a's figures over b's: throughput ratios and the TPOT and TTFT medians' ratios and gaps."""
    out = {k: a[k] / b[k] for k in ("req_per_s", "output_tok_per_s") if b.get(k)}
    for k in ("tpot_ms", "ttft_ms"):
        out[f"{k}_median_ratio"] = a[k]["median"] / b[k]["median"]
        out[f"{k}_median_added"] = a[k]["median"] - b[k]["median"]
    return out


def measure(args: argparse.Namespace, stack: Stack, log_dir: str) -> dict:
    run = Runs(args, stack.url)
    n = str(len(SCHEMAS))
    run("warmup", "--requests", "16")
    cold, _ = run("cold", "--requests", n, "--max-concurrency", "1", "--json-schemas", n)
    res: dict = {"cold_ttft_ms": cold.get("per_request_ttft_ms")}
    res["compiles"] = compile_times(os.path.join(log_dir, "worker-0.log"))
    low_json, low_path = run(
        "low-json", "--requests", str(args.low_load), "--max-concurrency", "1", "--json-schemas", n
    )
    low_free, _ = run("low-free", "--requests", str(args.low_load), "--max-concurrency", "1", "--output-lens", low_path)
    full_json, full_path = run("json", "--requests", str(args.requests), "--json-schemas", n)
    full_free, _ = run("free", "--requests", str(args.requests), "--output-lens", full_path)
    res["runs"] = {"low_json": low_json, "low_free": low_free, "json": full_json, "free": full_free}
    for r in res["runs"].values():
        r.pop("per_request_ttft_ms", None)
        r.pop("per_request_output_tokens", None)
    res["json_over_free"] = {"low_load": over(low_json, low_free), "workload": over(full_json, full_free)}
    return res


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, help="structured.json and each run's benchmark_serving JSON")
    ap.add_argument("--work-dir", default="/tmp/lightstream-bench-structured", help="the model directory, logs")
    ap.add_argument("--requests", type=int, default=2000, help="the fixed workload's first N requests")
    ap.add_argument("--low-load", type=int, default=20, help="requests sent one at a time, each way")
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--model-dir", default="", help="serve this model (real weights); default: the 8B shape, random")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=128256, help="prompt token ids are drawn below this")
    ap.add_argument("serving_args", nargs="*", help="after --: more flags for benchmark_serving.py")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    model_dir = args.model_dir or os.path.join(args.work_dir, "model")
    if not args.model_dir:
        make_bench_model.main(["--out", model_dir])
    log_dir = os.path.join(args.work_dir, "logs")
    if os.path.exists(os.path.join(log_dir, "worker-0.log")):
        os.remove(os.path.join(log_dir, "worker-0.log"))  # the compile times are this run's
    redis = RedisServer(binary=args.redis_server).start()
    opts = StackOptions(model_dir, redis.url, free_port(), log_dir=log_dir, namespace="structured")
    opts.worker_args, opts.router_args = worker_args(args), ROUTER_ARGS
    stack = Stack(opts)
    res: dict = {"date": time.strftime("%Y-%m-%d"), "requests": args.requests, "schemas": len(SCHEMAS)}
    try:
        stack.start()
        stack.wait_ready(timeout_s=600)
        res.update(measure(args, stack, log_dir))
    finally:
        stack.stop()
        redis.stop()
    print("json_over_free", json.dumps(res["json_over_free"]), flush=True)
    print("compile ms", [c["ms"] for c in res["compiles"]], flush=True)
    with open(os.path.join(args.out_dir, "structured.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
