"""cuBLAS against cuBLASLt on a decode step's projections (what services/worker/runtime/blas_choice.py
chooses between), at the Llama-3-8B shape, per batch size. GPU only.

    python tools/bench_blas.py --out FILE.json [--batches 1,8,32,64,128,256,512] [--layers 32]

Each projection's weights are drawn for every layer, so the L2 cache cannot hold them, and
the x @ w.t() of all layers is captured in a CUDA graph whose replays are timed, as a decode
step runs them. Reports µs per layer and the share of the measured copy bandwidth, for
weights stored [N, K] (LightStream's layout) and, for comparison, [K, N]; and the same
product computed as w @ x.t() ("wx"), and at batch 1 as torch.mv ("mv").
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from services.worker.runtime.blas_choice import LIBRARIES, graph_ms, prefer

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # [N, K]


def copy_gbps(reps: int = 10) -> float:
    """Device-to-device copy by a kernel, launched eagerly (a copy captured in a graph becomes
    a copy-engine node, which is slower)."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    end.synchronize()
    return 2 * a.numel() * reps / (start.elapsed_time(end) / 1e3) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,32,64,128,256,512")
    ap.add_argument("--layers", type=int, default=32)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_blas.py needs a CUDA GPU")
    bw = copy_gbps()
    print(f"copy {bw:.0f} GB/s", flush=True)
    rows = []
    for name, (n, k) in SHAPES.items():
        nk = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(args.layers)]
        layouts = {"nk": nk, "kn": [w.t().contiguous().t() for w in nk]}  # same shape, [K, N] storage
        for m in (int(b) for b in args.batches.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"projection": name, "batch": m}
            forms = {
                f"{lib}/{layout}": (lib, lambda x=x, ws=ws: [x @ w.t() for w in ws])
                for lib in LIBRARIES
                for layout, ws in layouts.items()
            }
            # the same product with the weight as the left operand: cuBLAS sees an [N, M] result, and at
            # M = 1 the result [N, 1] is the [1, N] row as laid out, so nothing is copied
            forms |= {f"{lib}/wx": (lib, lambda x=x, nk=nk: [w @ x.t() for w in nk]) for lib in LIBRARIES}
            if m == 1:
                forms["mv"] = (None, lambda x=x, nk=nk: [torch.mv(w, x[0]) for w in nk])
            for form, (lib, fn) in forms.items():
                with prefer(lib):
                    ms = graph_ms(fn)
                us = ms * 1000 / args.layers
                row[f"{form}_us"] = round(us, 2)
                row[f"{form}_pct_copy"] = round(100 * n * k * 2 / (us / 1e6) / 1e9 / bw, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
        del nk, layouts
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(
            {"gpu": torch.cuda.get_device_name(), "copy_GBps": bw, "torch": torch.__version__, "rows": rows},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
