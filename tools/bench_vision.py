"""Image requests through the whole stack against the Hugging Face peer, and the visual service's
encoder against the GPU's matmul rate, in one job (issue 49).

    python tools/bench_vision.py --out-dir DIR [--families llava,qwen2_5_vl] [--requests 64]
        [--encode-requests 256] [--visuals 2,1] [--image-size 448] [--peer tools/peer_vision.py|none]
        [--peer-batch 32] [--peer-timeout 200] [--model FAMILY=DIR ...] [--device cuda|cpu]
        [--redis-server PATH] [--kv-tokens 131072] [--warmup-requests 64]

1. Measures the device's matmul rate (tools/vision_flops.py: bf16 8192^3 on CUDA) and starts
   redis-server.
2. For each family: writes its real-shape model directory (tools/vision_bench_models.py:
   llava-1.5-7b, qwen2.5-vl-7b; --model FAMILY=DIR takes a directory instead), starts the stack
   (tools/stack.py) with the largest of --visuals replicas on the one GPU, the worker and the
   visual service drawing random weights (--random-weights true), and sends a warm-up. Then for
   each replica count, largest first (a replica beyond the count stopped with SIGTERM between):
   - encode: --encode-requests requests with one image each and one output token, all at once:
     the stack's images/s where encoding is most of the work;
   - serve: the workload's first --requests requests (sharegpt_shaped lengths), each with one
     --image-size synthetic image drawn from a seed, all at once: requests/s, TTFT, TPOT.
   Each run draws its images from seeds of its own, so neither the visual service's cache nor the
   worker's prompt cache holds any of them. The visual replicas' heartbeats before and after each
   run give the images encoded, the seconds in the tower (to the rows on the host) and preparing;
   with the tower's FLOPs per image (tools/vision_flops.py) that is its achieved TFLOP/s, set
   against the matmul rate.
3. The peer (tools/peer_vision.py, a process of its own with --peer-timeout) runs the serve run
   of the smallest replica count's requests, the same images from the same seeds, through
   transformers' batched generate; the ratio is the stack's requests/s over the peer's (issue 49:
   at least 10).
4. Writes DIR/vision.json after every family: each run's benchmark_serving figures, the encoder's
   figures, the peer's, the ratios (two replicas' encode images/s over one's).

On one H200 (tools/gpu_run.sh OUT vision) --requests 64 keeps the peer's two batches of 32 (each
to its longest output, at Hugging Face's eager decode) within --peer-timeout and the whole job
within 580 s; --encode-requests 256 gives the encoder eight full batches of 32 a replica count.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools import benchmark_serving, vision_bench_models
from tools.bench_families import read_json, run_job
from tools.peer_vision import prompt_vocab
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions
from tools.vision_flops import flops_per_image
from tools.vision_report import encoder_figures, family_ratios, visual_counters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY_SHAPES = {"llava": "llava-1.5-7b", "qwen2_5_vl": "qwen2.5-vl-7b"}
ROUTER_ARGS = ["--running-max-req-size", "4096", "--max-waiting", "20000"]
WARMUP_SEED, RUN_SEED = 1_000_000, 100_000  # run i's images from (i + 1) * RUN_SEED + k
KEYS = ("completed", "failed", "req_per_s", "output_tok_per_s", "duration_s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", required=True, help="vision.json, each run's JSON, the peer's JSON and log")
    ap.add_argument("--work-dir", default="/tmp/lightstream-bench-vision", help="model directories, logs")
    ap.add_argument("--families", default=",".join(FAMILY_SHAPES), help=f"of {','.join(FAMILY_SHAPES)}")
    ap.add_argument("--model", action="append", default=[], help="FAMILY=DIR: that model directory instead")
    ap.add_argument("--requests", type=int, default=64, help="the serve run's requests: the workload's first N")
    ap.add_argument("--encode-requests", type=int, default=256, help="the encode run's requests (one output token)")
    ap.add_argument("--visuals", default="2,1", help="visual replica counts, each measured (largest first)")
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--max-batch-images", type=int, default=32, help="each visual replica's batch")
    ap.add_argument("--warmup-requests", type=int, default=64, help="through the stack before the runs")
    ap.add_argument("--peer", default=os.path.join(ROOT, "tools", "peer_vision.py"), help="peer_vision.py, or none")
    ap.add_argument("--peer-batch", type=int, default=32)
    ap.add_argument("--peer-timeout", type=float, default=200.0, help="seconds the peer's process may take")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--random-weights", default="true", choices=("true", "false"), help="false: --model's weights")
    ap.add_argument("--kv-tokens", type=int, default=131072, help="the worker's KV pool; 0: its own sizing")
    ap.add_argument("--redis-server", default="redis-server")
    args = ap.parse_args(argv)
    args.family_list = [f for f in args.families.split(",") if f]
    if unknown := set(args.family_list) - set(FAMILY_SHAPES):
        ap.error(f"unknown families {sorted(unknown)}: choose from {','.join(FAMILY_SHAPES)}")
    args.model_dirs = dict(m.split("=", 1) for m in args.model)
    args.counts = sorted({int(c) for c in args.visuals.split(",") if c}, reverse=True)
    if not args.counts or args.counts[-1] < 1:
        ap.error(f"--visuals {args.visuals}: replica counts of at least 1")
    if args.random_weights == "false" and set(args.family_list) - set(args.model_dirs):
        ap.error("--random-weights false needs --model FAMILY=DIR (with weights) for every family")
    return args


def stack_options(args: argparse.Namespace, family: str, model_dir: str, redis: RedisServer) -> StackOptions:
    worker = ["--device", args.device, "--random-weights", args.random_weights]
    worker += ["--running-max-req-size", "2048", "--batch-max-tokens", "16384"]
    worker += ["--cuda-graph-max-bs", str(max(args.requests, args.warmup_requests))]
    if args.kv_tokens and args.device != "cpu":
        worker += ["--max-total-token-num", str(args.kv_tokens)]
    visual = ["--device", args.device, "--random-weights", args.random_weights]
    return StackOptions(
        model_dir=model_dir,
        redis_url=redis.url,
        port=free_port(),
        namespace=f"vis-{family}",
        log_dir=os.path.join(args.work_dir, "logs", family),
        worker_args=worker,
        router_args=ROUTER_ARGS,
        visual_args=[*visual, "--max-batch-images", str(args.max_batch_images)],
        visuals=args.counts[0],
    )


def serving(args: argparse.Namespace, stack: Stack, model_dir: str, out: str, n: int, seed: int, max_out: int) -> dict:
    """benchmark_serving's image requests through the stack: n, all at once, images from seed."""
    flags = ["--url", stack.url, "--out", out, "--requests", str(n), "--quiet", "--tokenizer", model_dir]
    flags += ["--vocab", str(prompt_vocab(model_dir)), "--images-per-request", "1"]
    flags += ["--image-size", str(args.image_size), "--image-seed", str(seed), "--timeout-s", "600"]
    if max_out:
        flags += ["--max-output", str(max_out)]
    (res,) = benchmark_serving.main(flags)
    return res


def measured(args: argparse.Namespace, stack: Stack, model_dir: str, run: dict) -> dict:
    """One run with the visual replicas' counters read before and after it."""
    before = visual_counters(stack.opts.redis_url, stack.opts.namespace)
    out = os.path.join(args.out_dir, f"{run['name']}.json")
    res = serving(args, stack, model_dir, out, run["requests"], run["seed"], run["max_output"])
    after = visual_counters(stack.opts.redis_url, stack.opts.namespace)
    print(run["name"], json.dumps({k: res.get(k) for k in KEYS}), flush=True)
    return {**run, "serving": res, "visual": {"before": before, "after": after}}


def run_stack(args: argparse.Namespace, family: str, model_dir: str, redis: RedisServer) -> dict:
    """The stack's runs at each replica count, largest first, on one stack."""
    stack = Stack(stack_options(args, family, model_dir, redis))
    runs: dict[str, dict] = {}
    try:
        t = time.perf_counter()
        stack.start()
        stack.wait_ready(timeout_s=600)
        ready_s = time.perf_counter() - t
        warm = os.path.join(args.work_dir, f"warmup-{family}.json")
        serving(args, stack, model_dir, warm, args.warmup_requests, WARMUP_SEED, 4)
        for i, count in enumerate(args.counts):
            for extra in range(count, args.counts[0]):  # the replicas beyond this count, stopped
                stack.kill_service(f"visual-{extra}", signal.SIGTERM)
            for j, (kind, n, max_out) in enumerate((("encode", args.encode_requests, 1), ("serve", args.requests, 0))):
                run = {"name": f"{family}-v{count}-{kind}", "visuals": count, "kind": kind, "requests": n}
                run |= {"seed": (2 * i + j + 1) * RUN_SEED, "max_output": max_out}
                runs[run["name"]] = measured(args, stack, model_dir, run)
    finally:
        stack.stop()
    return {"stack_ready_s": ready_s, "runs": runs}


def peer(args: argparse.Namespace, family: str, model_dir: str, seed: int) -> dict:
    """tools/peer_vision.py on the serve run's requests, as a process of its own."""
    out = os.path.join(args.out_dir, f"peer-{family}.json")
    cmd = [sys.executable, args.peer, "--model-dir", model_dir, "--out", out, "--requests", str(args.requests)]
    cmd += ["--batch-size", str(args.peer_batch), "--image-size", str(args.image_size), "--image-seed", str(seed)]
    cmd += ["--device", args.device, "--deadline-s", str(max(args.peer_timeout - 60, 10))]
    job = run_job(cmd, args.peer_timeout, out[:-5] + ".log")
    return {"job": job, **read_json(out)}


def run_family(args: argparse.Namespace, family: str, redis: RedisServer, matmul: float | None) -> dict:
    shape = FAMILY_SHAPES[family]
    model_dir = args.model_dirs.get(family) or vision_bench_models.write(os.path.join(args.work_dir, shape), shape)
    from shared.model_config import ModelConfig

    cfg = ModelConfig.from_dir(model_dir)
    flops = flops_per_image(cfg.vision, cfg.hidden_size, args.image_size, args.image_size)
    row: dict = {"model_dir": model_dir, "shape": shape if family not in args.model_dirs else None}
    row["tower_GFLOP_per_image"] = flops / 1e9
    row |= run_stack(args, family, model_dir, redis)
    for run in row["runs"].values():
        run["encoder"] = encoder_figures(run, flops, matmul)
    if args.peer != "none":
        serve = row["runs"][f"{family}-v{args.counts[-1]}-serve"]
        row["peer"] = peer(args, family, model_dir, serve["seed"])
    row["ratios"] = family_ratios(row, family, args.counts)
    print(family, json.dumps(row["ratios"]), flush=True)
    return row


def matmul_rate(args: argparse.Namespace) -> dict:
    """tools/vision_flops.py in a process of its own, so this one holds no device memory."""
    n = "8192" if args.device == "cuda" else "512"
    cmd = [sys.executable, os.path.join(ROOT, "tools", "vision_flops.py"), "--device", args.device, "--n", n]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = got.stdout.strip().splitlines()
    return json.loads(lines[-1]) if got.returncode == 0 and lines else {"error": got.stderr[-1000:]}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(args.work_dir, exist_ok=True)
    keep = ("families", "requests", "encode_requests", "visuals", "image_size", "max_batch_images", "peer_batch")
    res: dict = {"date": time.strftime("%Y-%m-%d"), "args": {k: getattr(args, k) for k in keep}, "families": {}}
    res["matmul"] = matmul_rate(args)
    print("matmul", json.dumps(res["matmul"]), flush=True)
    redis = RedisServer(binary=args.redis_server).start()
    try:
        for family in args.family_list:
            res["families"][family] = run_family(args, family, redis, res["matmul"].get("matmul_TFLOPs"))
            with open(os.path.join(args.out_dir, "vision.json"), "w") as f:
                json.dump(res, f, indent=1)
    finally:
        redis.stop()
    return res


if __name__ == "__main__":
    main()
