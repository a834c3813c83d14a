"""Each model family's offline throughput against its Hugging Face peer, in one job (issue 45),
and Qwen3-8B's decode step against Llama-3-8B's.

    python tools/bench_families.py --out FILE.json [--families all|llama,qwen3,...] [--requests 16]
        [--peer .peer/peer_hf.py|none] [--peer-timeout 240] [--engine-timeout 240]
        [--model FAMILY=DIR ...] [--device auto|cpu]
        [--decode-shapes qwen3-8b,llama3-8b|""] [--static 1x1024,64x1024]

For each family, one after the other on the same GPU: tools/benchmark_engine.py's offline part
on the first --requests requests of the fixed sharegpt_shaped workload (random bf16 weights at
the family's real shape, FAMILY_SHAPES), then the peer (../shared/bench/peer_hf.py --config, its
continuous-batching manager) on the same requests, each a process of its own so that each has
the whole GPU. Both figures are requests/s over the same N requests; the ratio is the engine's
over the peer's (issue 45's target: at least 10). A peer that runs out of --peer-timeout (or its
own 300 s deadline) gives no ratio: run fewer requests. --model FAMILY=DIR takes that model
directory's config.json (and, for the engine, its weights) instead of the family's shape. --peer
none runs the engine alone (the peer needs CUDA). No tokenizer is written: the engine and the
peer both take token ids.

--decode-shapes A,B first runs benchmark_engine.py's static part (decode step at each --static batch x
context, next to the bandwidth floor) for A, then B (each a shape, or a model directory), and
records A's step over B's (issue 45: Qwen3-8B within 10 % of Llama-3-8B). "" skips it. The
JSON is written after every job; each job's own JSON and log lie beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.worker.models.bench_shapes import SHAPES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_MAX_ID = 100_000  # peer_hf.py draws prompt ids from [1000, 100000)
FAMILY_SHAPES = {
    "llama": "llama3-8b",
    "mistral": "mistral-7b",
    "qwen2": "qwen2-7b",
    "qwen3": "qwen3-8b",
    "phi3": "phi3-mini",
    "mixtral": "mixtral-8x7b",
    "qwen2_moe": "qwen2-moe-a2.7b",  # Qwen1.5-MoE-A2.7B; Qwen2-57B-A14B's 114 GB leave the peer no cache
    "qwen3_moe": "qwen3-30b-a3b",
    "gemma2": "gemma2-9b",
    "gemma3": "gemma3-12b",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default="all", help=f"comma-separated, of {','.join(FAMILY_SHAPES)}; '': none")
    ap.add_argument("--requests", type=int, default=16, help="the workload's first N, for the engine and the peer")
    ap.add_argument("--peer", default=os.path.join(ROOT, ".peer", "peer_hf.py"), help="peer_hf.py, or none")
    ap.add_argument("--peer-timeout", type=float, default=240.0, help="seconds each peer run may take")
    ap.add_argument("--engine-timeout", type=float, default=240.0, help="seconds each engine run may take")
    ap.add_argument("--model", action="append", default=[], help="FAMILY=DIR: that model instead of the shape")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--decode-shapes", default="qwen3-8b,llama3-8b", help="A,B: A's decode step over B's; '': none")
    ap.add_argument("--static", default="1x1024,64x1024", help="the decode comparison's batch x context points")
    args = ap.parse_args(argv)
    args.family_list = list(FAMILY_SHAPES) if args.families == "all" else [f for f in args.families.split(",") if f]
    if unknown := set(args.family_list) - set(FAMILY_SHAPES):
        ap.error(f"unknown families {sorted(unknown)}: choose from {','.join(FAMILY_SHAPES)}")
    if args.peer != "none" and args.requests < 4:
        ap.error("--requests: at least 4 with the peer (its warm-up takes the first four prompts)")
    args.model_dirs = dict(m.split("=", 1) for m in args.model)
    if unknown := set(args.model_dirs) - set(FAMILY_SHAPES):
        ap.error(f"--model: unknown families {sorted(unknown)}")
    args.decode_pair = [s for s in args.decode_shapes.split(",") if s]
    if args.decode_pair and (len(args.decode_pair) != 2 or not all(map(_model_arg, args.decode_pair))):
        ap.error(f"--decode-shapes {args.decode_shapes}: want two, each a model directory or one of {','.join(SHAPES)}")
    return args


def _model_arg(shape_or_dir: str) -> list[str]:
    """benchmark_engine.py's flag for a shape's name or a model directory; [] for neither."""
    if shape_or_dir in SHAPES:
        return ["--shape", shape_or_dir]
    return ["--model-dir", shape_or_dir] if os.path.isdir(shape_or_dir) else []


def run_job(cmd: list[str], timeout: float, log: str) -> dict:
    """Run cmd with its output in log; -> its exit status, seconds and whether it timed out."""
    t = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return {"rc": rc, "timed_out": rc is None, "seconds": round(time.perf_counter() - t, 1), "log": log}


def read_json(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def engine_cmd(args: argparse.Namespace, family: str, out: str) -> list[str]:
    """benchmark_engine.py's offline part; decode graphs for batches up to N only, which is all
    N requests can make (quicker to capture)."""
    return [
        sys.executable,
        os.path.join(ROOT, "tools", "benchmark_engine.py"),
        *_model_arg(args.model_dirs.get(family, FAMILY_SHAPES[family])),
        "--parts",
        "offline",
        "--requests",
        str(args.requests),
        "--cuda-graph-max-bs",
        str(args.requests),
        "--device",
        args.device,
        "--out",
        out,
    ]


def peer_config(args: argparse.Namespace, family: str, work: str) -> str:
    """The folder whose config.json the peer builds its model from."""
    if family in args.model_dirs:
        return args.model_dirs[family]
    folder = os.path.join(work, FAMILY_SHAPES[family])
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(SHAPES[FAMILY_SHAPES[family]], f, indent=1)
    return folder


def peer_cmd(args: argparse.Namespace, config: str, out: str) -> list[str]:
    """The peer's command; through tools/peer_vocab.py for a vocabulary smaller than the ids of
    the peer's prompts (below PEER_MAX_ID), which would read past its embedding table."""
    skip = "cpu,roofline,static_b1,static_b64"  # the continuous-batching part only
    cmd = [sys.executable, args.peer, "--config", config, "--requests", str(args.requests)]
    if _vocab_size(config) < PEER_MAX_ID:
        cmd[1:2] = [os.path.join(ROOT, "tools", "peer_vocab.py"), args.peer]
    return [*cmd, "--skip", skip, "--out", out]


def _vocab_size(config: str) -> int:
    with open(os.path.join(config, "config.json") if os.path.isdir(config) else config) as f:
        cfg = json.load(f)
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size") or PEER_MAX_ID)


def family_row(n: int, engine: dict, engine_job: dict, peer: dict | None, peer_job: dict | None) -> dict:
    """One family's figures: engine and peer requests/s on the same n requests, and the ratio
    where both finished them all; else what went wrong."""
    off = engine.get("offline", {})
    row: dict = {"requests": n, "engine_job": engine_job, "engine_req_per_s": off.get("req_per_s")}
    if off and off.get("requests") != n:
        row["engine_error"] = f"the engine ran {off.get('requests')} requests, not {n}"
        row["engine_req_per_s"] = None
    elif not off:
        row["engine_error"] = "no offline figures: see engine_job's log"
    if peer_job is None:
        row["peer"] = "not run"
        return row
    row["peer_job"] = peer_job
    cb = (peer or {}).get("cb_offline", {})
    done = cb.get("requests_done") == n and not cb.get("stopped")
    row["peer_req_per_s"] = cb.get("req_per_s") if done else None
    if not done:
        why = "timed out" if peer_job["timed_out"] else "no result: see peer_job's log"
        row["peer_error"] = cb.get("error") or cb.get("stopped") or why
    rps = row["engine_req_per_s"]
    if rps and row["peer_req_per_s"]:
        row["ratio"] = rps / row["peer_req_per_s"]
    return row


def static_cmd(args: argparse.Namespace, shape: str, out: str) -> list[str]:
    """benchmark_engine.py's static part at --static's points (and the ceilings, for the floor)."""
    batch = max(int(p.split("x")[0]) for p in args.static.split(","))
    cmd = [sys.executable, os.path.join(ROOT, "tools", "benchmark_engine.py"), *_model_arg(shape)]
    cmd += ["--parts", "ceilings,static", "--static", args.static, "--cuda-graph-max-bs", str(batch)]
    return [*cmd, "--device", args.device, "--out", out]


def step_ratios(a: list[dict], b: list[dict]) -> dict[str, float]:
    """A's decode step over B's at each batch x context both measured (benchmark_engine's static rows)."""
    steps = {(y["batch"], y["context"]): y["ms_per_step"] for y in b}
    return {
        f"{x['batch']}x{x['context']}": x["ms_per_step"] / steps[(x["batch"], x["context"])]
        for x in a
        if (x["batch"], x["context"]) in steps
    }


def decode_compare(args: argparse.Namespace, out_dir: str) -> dict:
    """Decode step of each of the two shapes at --static's points; A's step over B's at each."""
    runs = {}
    for k, shape in enumerate(args.decode_pair):
        out = os.path.join(out_dir, f"static-{k}-{os.path.basename(shape)}.json")
        job = run_job(static_cmd(args, shape, out), args.engine_timeout, out[:-5] + ".log")
        runs[shape] = {"job": job, "static": read_json(out).get("static", [])}
    a, b = (runs[s]["static"] for s in args.decode_pair)
    return {"shapes": args.decode_pair, "runs": runs, "step_ratio": step_ratios(a, b)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="lightstream-families-")
    res: dict = {"date": time.strftime("%Y-%m-%d"), "args": {k: v for k, v in vars(args).items()}, "families": {}}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    if args.decode_pair:  # first: the cheaper of the two, and a target of its own
        res["decode"] = decode_compare(args, out_dir)
        print("decode", json.dumps(res["decode"]["step_ratio"]), flush=True)
        save()
    for family in args.family_list:
        engine_out = os.path.join(out_dir, f"engine-{family}.json")
        engine_job = run_job(engine_cmd(args, family, engine_out), args.engine_timeout, engine_out[:-5] + ".log")
        peer, peer_job = None, None
        if args.peer != "none":
            peer_out = os.path.join(out_dir, f"peer-{family}.json")
            cmd = peer_cmd(args, peer_config(args, family, work), peer_out)
            peer_job = run_job(cmd, args.peer_timeout, peer_out[:-5] + ".log")
            peer = read_json(peer_out)
        row = family_row(args.requests, read_json(engine_out), engine_job, peer, peer_job)
        res["families"][family] = {"shape": args.model_dirs.get(family, FAMILY_SHAPES[family]), **row}
        print(family, json.dumps({k: v for k, v in row.items() if not k.endswith("_job")}), flush=True)
        save()
    return res


if __name__ == "__main__":
    main()
