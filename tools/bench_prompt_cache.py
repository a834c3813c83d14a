"""The prompt cache through the whole pipeline, in one job: each variant (a router policy, the
prompt cache on or off) on a stack of its own, the same workload through tools/benchmark_serving.py.

    python tools/bench_prompt_cache.py --out-dir DIR [--workload shared_prefix|multi_turn|sharegpt]
        [--policies cache_aware,round_robin] [--prompt-cache on|off|on,off] [--groups 2]
        [--gpus-per-group 1 | --kv-tokens N] [--redis-server PATH] [--model-dir DIR --device cpu]
        [-- more tools/benchmark_serving.py flags]

1. Writes a Llama-3-8B-shaped model directory (tools/make_bench_model.py; the workers draw
   random weights) unless --model-dir names one, and starts redis-server.
2. For each policy, and in it each prompt-cache setting: starts the four services
   (tools/stack.py) with --groups data-parallel worker groups, the router's --routing-policy
   POLICY ("default": no flag, the router's own) and, for "off", the workers'
   --disable-prompt-cache; sends a short warm-up, runs benchmark_serving with --workload, and
   stops the stack. With --gpus-per-group 1 each group has a GPU of its own; with 0 they share
   the machine's GPU, and --kv-tokens sizes each group's KV pool (a share of the free memory
   cannot: the group that starts first would take it).
3. Writes DIR/prompt_cache.json: each variant's figures (requests/s, output tokens/s, TTFT,
   TPOT and the hit rate the responses' usage reports) and the ratios between variants: the
   first policy's over the second's, and the prompt cache on over off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import benchmark_serving, make_bench_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions

ROUTER_ARGS = ["--running-max-req-size", "4096", "--max-waiting", "20000"]
# 16 requests through every service first, none sharing a prefix with a timed one (a seed no
# timed workload draws from)
WARMUP = ["--workload", "shared_prefix", "--workload-seed", "2", "--shared-prefix-groups", "2"]
WARMUP += ["--shared-prefix-per-group", "8", "--shared-prefix-system", "256", "--shared-prefix-output", "16"]
RATIO_KEYS = ("req_per_s", "output_tok_per_s")


def worker_args(args: argparse.Namespace, cache_on: bool) -> list[str]:
    out = ["--device", args.device, "--running-max-req-size", "2048", "--batch-max-tokens", "16384"]
    if not args.model_dir:
        out += ["--random-weights", "true"]
    if args.kv_tokens:
        out += ["--max-total-token-num", str(args.kv_tokens)]
    return out if cache_on else [*out, "--disable-prompt-cache", "true"]


def run_variant(args: argparse.Namespace, model_dir: str, redis: RedisServer, policy: str, cache_on: bool) -> dict:
    """One stack with this policy and setting, the warm-up and the workload through it."""
    name = f"{policy}-{'on' if cache_on else 'off'}"
    router = ROUTER_ARGS if policy == "default" else [*ROUTER_ARGS, "--routing-policy", policy]
    stack = Stack(
        StackOptions(
            model_dir=model_dir,
            redis_url=redis.url,
            port=free_port(),
            namespace=f"pc-{name}",
            log_dir=os.path.join(args.work_dir, "logs", name),
            workers=args.groups,
            gpus_per_worker=args.gpus_per_group,
            fronts=args.fronts,
            worker_args=worker_args(args, cache_on),
            router_args=router,
        )
    )
    common = ["--url", stack.url, "--vocab", str(args.vocab), "--quiet"]
    try:
        t = time.perf_counter()
        stack.start()
        stack.wait_ready(timeout_s=600)
        ready_s = time.perf_counter() - t
        benchmark_serving.main([*common, "--out", os.path.join(args.work_dir, f"warmup-{name}.json"), *WARMUP])
        out = os.path.join(args.out_dir, f"serving-{name}.json")
        workload = ["--workload", args.workload, "--tokenizer", model_dir]
        (res,) = benchmark_serving.main([*common, "--out", out, *workload, *args.serving_args])
    finally:
        stack.stop()
    print(name, json.dumps({k: res.get(k) for k in ("completed", "failed", *RATIO_KEYS, "hit_rate")}), flush=True)
    return {"policy": policy, "prompt_cache": "on" if cache_on else "off", "stack_ready_s": ready_s, **res}


def ratios(runs: dict[str, dict], policies: list[str], settings: list[str]) -> dict:
    """The first policy's figures over the second's (each setting), and on over off (each policy)."""

    def over(a: dict, b: dict) -> dict:
        return {k: a[k] / b[k] for k in RATIO_KEYS if b.get(k)}

    out = {}
    if len(policies) == 2:
        first, second = policies
        out[f"{first}_over_{second}"] = {s: over(runs[f"{first}-{s}"], runs[f"{second}-{s}"]) for s in settings}
    if set(settings) == {"on", "off"}:
        out["on_over_off"] = {p: over(runs[f"{p}-on"], runs[f"{p}-off"]) for p in policies}
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, help="prompt_cache.json and each variant's benchmark_serving JSON")
    ap.add_argument("--work-dir", default="/tmp/lightstream-bench-cache", help="the model directory, logs")
    ap.add_argument("--workload", choices=("shared_prefix", "multi_turn", "sharegpt"), default="shared_prefix")
    ap.add_argument("--policies", default="cache_aware,round_robin", help='router policies; "default": no flag')
    ap.add_argument("--prompt-cache", default="on", help="on, off or on,off")
    ap.add_argument("--groups", type=int, default=2, help="data-parallel worker groups")
    ap.add_argument("--gpus-per-group", type=int, default=1, help="0: the groups share the machine's GPU")
    ap.add_argument("--kv-tokens", type=int, default=0, help="each group's KV pool; 0: the worker's own sizing")
    ap.add_argument("--fronts", type=int, default=2, help="front-end processes sharing the port")
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--model-dir", default="", help="serve this model (real weights); default: the 8B shape, random")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=128256, help="prompt token ids are drawn below this")
    ap.add_argument("serving_args", nargs="*", help="after --: more flags for benchmark_serving.py")
    args = ap.parse_args(argv)
    args.policy_list, args.settings = args.policies.split(","), args.prompt_cache.split(",")
    if set(args.settings) - {"on", "off"}:
        ap.error(f"--prompt-cache {args.prompt_cache}: want on, off or on,off")
    if args.groups > 1 and not args.gpus_per_group and not args.kv_tokens and args.device == "cuda":
        ap.error("groups sharing a GPU need --kv-tokens (each group's KV pool)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    model_dir = args.model_dir or os.path.join(args.work_dir, "model")
    if not args.model_dir:
        make_bench_model.main(["--out", model_dir])
    keys = ("workload", "policies", "prompt_cache", "groups", "gpus_per_group", "kv_tokens", "serving_args")
    res: dict = {"date": time.strftime("%Y-%m-%d"), **{k: getattr(args, k) for k in keys}, "runs": {}}
    redis = RedisServer(binary=args.redis_server).start()
    try:
        for policy in args.policy_list:
            for setting in args.settings:
                res["runs"][f"{policy}-{setting}"] = run_variant(args, model_dir, redis, policy, setting == "on")
                _save(args, res)
    finally:
        redis.stop()
    res["ratios"] = ratios(res["runs"], args.policy_list, args.settings)
    print("ratios", json.dumps(res["ratios"]), flush=True)
    _save(args, res)
    return res


def _save(args: argparse.Namespace, res: dict) -> None:
    with open(os.path.join(args.out_dir, "prompt_cache.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
