"""Launch configurations of the decode-size weight GEMMs (kernels/fp8_weight_matmul.py and
kernels/int4_matmul.py, AWQ group 128), swept at Llama-3-8B's projections (qkv, o, gate|up, down)
for M = 1, 4 and 16 (--rows: others; past 16 rows FP8's x8 tiles against torch._scaled_mm): the
data behind gemm_tiles.py's FP8_TILES and INT4_TILES (issue 47).

    python tools/kernel_quant_sweep.py --out FILE.json [--workers 12] [--rows 1,4,16] [--variants fp8,int4]
    python tools/kernel_quant_sweep.py --cpu-smoke --out FILE.json   # tiny shapes, Triton interpreter

A point (variant, projection, M) times its candidates (gemm_tiles.py's Tile) in the three rounds
of tools/quant_sweep_candidates.py: the tiles and warps (at M <= 4 the FMA, dot=False, tiles
too), then the splits of the best, then their stages; at most about 60 a point, 95 with the FMA
tiles. Every kernel a round needs is compiled first by
--workers processes into Triton's disk cache, so the timing process only loads them. Each
candidate is timed from a CUDA graph of REPLAYS products that cycle through copies of the weight
(at least FLUSH_BYTES of them, so the weight comes from memory as in a decode step, not from
L2): the median of REPEATS replays. The best `keep` are checked against the PyTorch reference
(dequantize, then matmul); the fastest that agrees is the point's best.

The JSON, per variant, projection and M: the best Tile and its µs, the default's (FP8_DEFAULT,
INT4_DEFAULT) µs, the floor (weight, x and out bytes at the device-to-device copy rate, measured
as bench_kernels' ceilings part does) and each one's fraction of it, and the fastest rows timed.
The end of the output is the table literal to paste into gemm_tiles.py: the points whose best
beats the default by MARGIN.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from services.worker.kernels.gemm_tiles import Tile
from services.worker.models.layers.fp8_product import TRITON_MAX_M
from tools.quant_sweep_candidates import (
    DEFAULTS,
    GROUP,
    SMOKE,
    VARIANTS,
    Space,
    first_round,
    k_steps,
    next_round,
)

TABLES = {"fp8": "FP8_TILES", "int4": "INT4_TILES"}
FLUSH_BYTES = 256 << 20  # a graph's weight copies add up to at least this: several times an H200's L2
REPEATS = 5
MARGIN = 0.03  # a point enters the table when its best is this much faster than the default
TOLERANCE = 2e-2  # bfloat16's, as the kernels' tests


def projections(smoke: bool) -> dict[str, tuple[int, int]]:
    """name -> (N, K): Llama-3-8B's projections, or one tiny shape for the smoke run."""
    from tools.bench_kernels import Shapes
    from tools.kernel_quant_gemm import projections as llama

    return {"qkv": (256, 256)} if smoke else llama(Shapes())


def make_weight(variant: str, n: int, k: int, dev: torch.device, dtype: torch.dtype, filled: bool):
    """A random [N, K] weight quantized as the variant's (filled), or zeros of its layout: enough
    to compile the kernel for it."""
    from services.worker.models.fp8_weight import FP8, Fp8Weight
    from services.worker.models.int4_formats import from_awq, to_awq
    from services.worker.models.int4_weight import Int4Weight

    if not filled:
        if variant == "fp8":
            return Fp8Weight(torch.zeros(n, k, dtype=torch.uint8, device=dev).view(FP8), torch.ones(n, device=dev))
        return Int4Weight(
            torch.zeros(k // 8, n, dtype=torch.int32, device=dev),
            torch.zeros(k // GROUP, n, dtype=torch.uint8, device=dev),
            torch.ones(k // GROUP, n, dtype=dtype, device=dev),
            GROUP,
        )
    w = torch.randn(n, k, device=dev) * k**-0.5
    if variant == "fp8":
        return Fp8Weight.quantize(w)
    awq = to_awq(w, GROUP)
    return from_awq(awq["qweight"], awq["qzeros"], awq["scales"], GROUP).to(dev, dtype)


def weight_bytes(variant: str, n: int, k: int) -> int:
    return n * k + 4 * n if variant == "fp8" else n * k // 2 + 3 * n * k // GROUP


def product(variant: str) -> Callable:
    """(x, w, tile) -> x @ W.t() by the variant's kernel."""
    from services.worker.kernels.fp8_weight_matmul import fp8_weight_matmul
    from services.worker.kernels.int4_matmul import int4_matmul

    return fp8_weight_matmul if variant == "fp8" else int4_matmul


def compile_key(variant: str, n: int, k: int, m: int, t: Tile, dev: torch.device) -> tuple:
    """What the compiled kernel of a launch depends on (the split only by whether it splits; M by
    how Triton specialises an integer): launches of one key share one compile."""
    from services.worker.kernels.split_k_sum import plan_split

    wb = n * k if variant == "fp8" else n * k // 2
    plan = plan_split(m, n, k_steps(variant, k, t), t.block_n, t.block_k, wb, dev, t.split, t.dot)
    split = plan.partials is not None
    return (variant, replace(t, split=None), plan.block_m, split, k % t.block_k == 0, m == 1, m % 16 == 0)


_WORKER: dict = {}  # a compile worker's last weight: (variant, n, k) -> weight


def _compile_one(job: tuple[str, int, int, int, Tile]) -> str:
    """In a worker: launch one candidate at its shape, which compiles it into Triton's disk cache.
    -> "" or the error."""
    variant, n, k, m, t = job
    dev = torch.device("cuda")
    if (variant, n, k) not in _WORKER:
        _WORKER.clear()
        _WORKER[(variant, n, k)] = make_weight(variant, n, k, dev, torch.bfloat16, filled=False)
    try:
        product(variant)(torch.zeros(m, k, device=dev, dtype=torch.bfloat16), _WORKER[(variant, n, k)], tile=t)
        torch.cuda.synchronize()
    except Exception as exc:  # out of shared memory or registers: the candidate is skipped
        return _error(exc)
    return ""


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"


@dataclass
class Point:
    """One variant's product at one shape and M: each candidate's µs, or why it did not run."""

    variant: str
    name: str
    n: int
    k: int
    m: int
    us: dict[Tile, float] = field(default_factory=dict)
    errors: dict[Tile, str] = field(default_factory=dict)
    scaled_mm_us: float | None = None  # FP8 past TRITON_MAX_M rows: what runs without an entry

    def ranked(self) -> list[Tile]:
        return sorted(self.us, key=self.us.__getitem__)


class Bench:
    """A variant's weight at one shape, in copies that together outgrow L2, and x for each M."""

    def __init__(self, variant: str, n: int, k: int, dev: torch.device, dtype: torch.dtype, space: Space) -> None:
        w = make_weight(variant, n, k, dev, dtype, filled=True)
        copies = min(space.replays, -(-FLUSH_BYTES // weight_bytes(variant, n, k))) if dev.type == "cuda" else 1
        self.weights = [w, *(_clone(w) for _ in range(copies - 1))]
        self.fn = product(variant)
        self.xs = {m: torch.randn(m, k, device=dev).to(dtype) for m in space.rows}

    def call(self, m: int, t: Tile) -> Callable[[int], torch.Tensor]:
        """i -> the product of M rows with the i-th weight copy (cyclically)."""
        return lambda i: self.fn(self.xs[m], self.weights[i % len(self.weights)], tile=t)

    def scaled_mm(self, m: int) -> Callable[[int], torch.Tensor]:
        """i -> what an FP8 product of M rows past TRITON_MAX_M runs without a table entry:
        x quantized per token, then torch._scaled_mm."""
        from services.worker.models.layers.fp8_product import fp8_scaled_mm

        return lambda i: fp8_scaled_mm(self.xs[m], self.weights[i % len(self.weights)])

    def check(self, m: int, t: Tile) -> float:
        """The largest error of t's product past the reference's tolerance (<= 0: it agrees)."""
        from services.worker.models.fp8_weight import Fp8Weight, fp8_reference
        from services.worker.models.int4_weight import int4_reference
        from services.worker.models.layers.fp8_product import tokens_as_quantized

        w, x = self.weights[0], self.xs[m]
        ref_x = tokens_as_quantized(x) if t.x8 else x  # an x8 tile multiplies the x it quantized
        ref = (fp8_reference if isinstance(w, Fp8Weight) else int4_reference)(ref_x, w).float()
        got = self.fn(x, w, tile=t).float()
        return float(((got - ref).abs() - TOLERANCE * (1 + ref.abs())).max())


def _clone(w):
    return replace(w, **{k: v.clone() for k, v in vars(w).items() if isinstance(v, torch.Tensor)})


def time_us(call: Callable[[int], object], cuda: bool, replays: int) -> float:
    """µs a call: on CUDA from a graph of call(0 .. replays - 1), the median of REPEATS replays
    after one untimed; off CUDA one plain call (its number means nothing)."""
    start = time.perf_counter()
    call(0)  # compiles, or loads from the cache, outside the capture
    if not cuda:
        return (time.perf_counter() - start) * 1e6
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(replays):
            call(i)
    graph.replay()
    times = []
    for _ in range(REPEATS):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3 / replays)
    return statistics.median(times)


def precompile(pool: ProcessPoolExecutor | None, jobs: dict[tuple, tuple]) -> dict[tuple, str]:
    """Compile each job's kernel in the pool's workers -> compile key: error ("" when it built)."""
    if pool is None or not jobs:
        return {}
    ordered = sorted(jobs.items(), key=lambda kv: kv[1][:4])  # a worker's jobs mostly share a weight
    try:
        errors = pool.map(_compile_one, [job for _, job in ordered], chunksize=4)
        return {key: err for (key, _), err in zip(ordered, errors, strict=True)}
    except Exception as exc:  # a broken pool: the timing process compiles what it launches
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling while timing", flush=True)
        return {}


def run_round(rnd: int, points: list[Point], benches: dict, pool, dev: torch.device, space: Space) -> None:
    """Time round rnd's candidates at every point (their kernels compiled first, in the pool)."""
    todo: dict[int, list[Tile]] = {}
    jobs: dict[tuple, tuple] = {}
    for i, p in enumerate(points):
        if rnd == 0:
            made = first_round(p.variant, p.k, p.m, space)
        else:
            made = next_round(rnd, p.variant, p.k, p.m, p.ranked(), space)
        todo[i] = [t for t in made if t not in p.us and t not in p.errors]
        for t in todo[i]:
            jobs.setdefault(compile_key(p.variant, p.n, p.k, p.m, t, dev), (p.variant, p.n, p.k, p.m, t))
    errors = precompile(pool, jobs)
    for i, p in enumerate(points):
        bench = benches[p.variant, p.name]
        for t in todo[i]:
            if err := errors.get(compile_key(p.variant, p.n, p.k, p.m, t, dev)):
                p.errors[t] = err
                continue
            try:
                p.us[t] = time_us(bench.call(p.m, t), dev.type == "cuda", space.replays)
            except Exception as exc:  # what the workers did not build: out of resources
                p.errors[t] = _error(exc)
    print(f"round {rnd}: {sum(map(len, todo.values()))} candidates, {len(jobs)} kernels", flush=True)


def point_report(p: Point, bench: Bench, floor_us: float, space: Space) -> dict:
    """The point's best (the fastest that agrees with the reference), the default's time, the floor."""
    checked = [{**asdict(t), "us": p.us[t], "excess_err": bench.check(p.m, t)} for t in p.ranked()[: space.keep]]
    best = next((c for c in checked if c["excess_err"] <= 0), None)
    d_us = p.us.get(DEFAULTS[p.variant])
    row: dict = {"best": None, "default": asdict(DEFAULTS[p.variant]), "default_us": d_us, "floor_us": floor_us}
    if best is not None:
        tile = {k: best[k] for k in asdict(DEFAULTS[p.variant])}
        row.update(best=tile, us=best["us"], of_floor=floor_us / best["us"])
        row["speedup"] = d_us / best["us"] if d_us else None
    row["default_of_floor"] = floor_us / d_us if d_us else None
    row["scaled_mm_us"] = p.scaled_mm_us
    row.update(timed=len(p.us), failed=len(p.errors), checked=checked)
    row["fastest"] = [{**asdict(t), "us": p.us[t]} for t in p.ranked()[:8]]
    row["errors"] = sorted(set(p.errors.values()))[:5]
    return row


def table_literal(report: dict) -> str:
    """The gemm_tiles.py tables: each point whose best beats by MARGIN what runs without an entry
    (the default; for FP8 past TRITON_MAX_M rows, torch._scaled_mm), an FMA tile with dot=False
    and an e4m3-activation tile with x8=True after its split."""
    from services.worker.kernels.gemm_tiles import m_bucket

    lines = []
    for variant in report["variants"]:
        lines += [
            f"{TABLES[variant]}: TileTable = {{  # (N, K, M bucket): Tile(BLOCK_N, BLOCK_K, warps, stages, split)"
        ]
        for name, shape in report[variant].items():
            for m, row in shape["rows"].items():
                base = row.get("scaled_mm_us") or row["default_us"]
                if row["best"] is None or base is None or row["us"] > base * (1 - MARGIN):
                    continue
                t = Tile(**row["best"])
                key = (shape["n"], shape["k"], m_bucket(int(m)))
                fields = f"{t.block_n}, {t.block_k}, {t.num_warps}, {t.num_stages}, {t.split}"
                fields += ("" if t.dot else ", dot=False") + (", x8=True" if t.x8 else "")
                versus = "_scaled_mm" if row.get("scaled_mm_us") else "default"
                lines.append(f"    {key}: Tile({fields}),  # {name}: {row['us']:.1f} us, {versus} {base:.1f}")
        lines.append("}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"from {','.join(VARIANTS)}")
    p.add_argument("--workers", type=int, default=max(0, min(12, (os.cpu_count() or 1) - 2)), help="compile processes")
    p.add_argument("--budget-s", type=float, default=200, help="no further round starts past this many seconds")
    p.add_argument("--cpu-smoke", action="store_true", help="a tiny shape under the Triton interpreter, on the CPU")
    p.add_argument("--rows", default=None, help="the M values swept (default 1,4,16; e.g. 32,64,128,256)")
    return p.parse_args(argv)


def sweep(args: argparse.Namespace, dev: torch.device, copy_gbs: float) -> dict:
    """Every point's three rounds, then its report: {variant: {projection: {n, k, rows: {M: row}}}}."""
    import multiprocessing

    space = SMOKE if args.cpu_smoke else Space()
    if args.rows:
        space = replace(space, rows=tuple(int(m) for m in args.rows.split(",")))
    dtype = torch.float16 if args.cpu_smoke else torch.bfloat16  # the interpreter has no bfloat16 dot
    variants = args.variants.split(",")
    shapes = projections(args.cpu_smoke)
    benches = {(v, name): Bench(v, n, k, dev, dtype, space) for v in variants for name, (n, k) in shapes.items()}
    points = [Point(v, name, n, k, m) for v in variants for name, (n, k) in shapes.items() for m in space.rows]
    pool = None
    if dev.type == "cuda" and args.workers > 0:
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))
    started = time.time()
    try:
        for rnd in range(3):
            if rnd and time.time() - started > args.budget_s:
                print(f"round {rnd} and later skipped: past --budget-s {args.budget_s}", flush=True)
                break
            run_round(rnd, points, benches, pool, dev, space)
            print(f"round {rnd} done at {time.time() - started:.0f} s", flush=True)
        for p in points:
            if p.variant == "fp8" and p.m > TRITON_MAX_M and dev.type == "cuda":
                p.scaled_mm_us = time_us(benches[p.variant, p.name].scaled_mm(p.m), True, space.replays)
    finally:
        if pool is not None:
            pool.shutdown()
    report: dict = {"variants": variants}
    for p in points:
        shape = report.setdefault(p.variant, {}).setdefault(p.name, {"n": p.n, "k": p.k, "rows": {}})
        moved = weight_bytes(p.variant, p.n, p.k) + 2 * p.m * (p.n + p.k)
        row = point_report(p, benches[p.variant, p.name], moved / (copy_gbs * 1e3), space)
        shape["rows"][str(p.m)] = row
        us, d_us = (f"{v:.1f}" if v else "-" for v in (row.get("us"), row["default_us"]))
        sm = f", _scaled_mm {row['scaled_mm_us']:.1f} us" if row["scaled_mm_us"] else ""
        print(f"{p.variant} {p.name} M={p.m}: best {row['best']} {us} us, default {d_us} us{sm}", flush=True)
    return report


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    elif not torch.cuda.is_available():
        raise SystemExit("kernel_quant_sweep: no CUDA device (use --cpu-smoke to check the script on the CPU)")
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        raise SystemExit(f"kernel_quant_sweep: unknown variants {sorted(unknown)}")
    from tools.bench_kernels import SMOKE as SMOKE_SHAPES
    from tools.bench_kernels import Shapes, Timer, bench_ceilings

    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    torch.manual_seed(0)
    started = time.time()
    ceilings = bench_ceilings(SMOKE_SHAPES if args.cpu_smoke else Shapes(), dev, Timer(dev.type == "cuda"))
    copy_gbs = ceilings["copy"]["GB/s"]
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the copy's buffers
    report = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter smoke run)"}
    report["copy_GBps"] = copy_gbs
    report.update(sweep(args, dev, copy_gbs))
    report["table"] = table_literal(report)
    report["seconds"] = time.time() - started
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"swept in {report['seconds']:.0f} s; for services/worker/kernels/gemm_tiles.py:\n{report['table']}")
    return report


if __name__ == "__main__":
    main()
