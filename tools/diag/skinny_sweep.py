"""The skinny matmul kernel (services/worker/kernels/skinny_matmul.py) by launch config, against
cuBLAS and cuBLASLt, on the Llama-3-8B projections at decode batch sizes. GPU only.

Each point is one projection's product over 32 layers' own weights (so L2 cannot hold them, as in
a decode step), captured in one CUDA graph and timed over its replays, in µs per layer. Each
config's result is checked against cuBLAS's on the first layer. Prints one JSON line per point and
then, per (projection, batch), the best config beside the better BLAS library.

    python3 tools/diag/skinny_sweep.py [--batches 1,4,16,32,64] [--quick] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.blas_choice import LIBRARIES, prefer
from services.worker.kernels.skinny_matmul import skinny_matmul
from tools.bench_blas import SHAPES, copy_gbps, graph_ms

LAYERS = 32


def configs(quick: bool) -> list[dict[str, int]]:
    out = []
    grid = itertools.product((16, 32, 64), (128, 256, 512), (3, 5), (4, 8), (1, 2, 4))
    for block_n, block_k, stages, warps, split in grid:
        tile = block_n * block_k * 2
        if tile * stages > 160 * 1024 or (quick and (warps == 8 or stages == 3)):
            continue
        out.append({"BLOCK_N": block_n, "BLOCK_K": block_k, "num_stages": stages, "num_warps": warps,
                    "SPLIT_K": split})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,4,16,32,64")
    ap.add_argument("--projections", default=",".join(SHAPES))
    ap.add_argument("--quick", action="store_true", help="4 warps and 5 stages only")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("skinny_sweep.py needs a CUDA GPU")
    bw = copy_gbps()
    print(json.dumps({"copy_GBps": round(bw), "gpu": torch.cuda.get_device_name()}), flush=True)
    sink = open(args.out, "w") if args.out else None  # noqa: SIM115
    best = []
    for name in args.projections.split(","):
        n, k = SHAPES[name]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(LAYERS)]
        for m in (int(b) for b in args.batches.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x @ ws[0].t()
            base = {}
            for lib in LIBRARIES:
                with prefer(lib):
                    base[lib] = graph_ms(lambda x=x, ws=ws: [x @ w.t() for w in ws]) * 1000 / LAYERS
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in ws]
            points = []
            for cfg in configs(args.quick):
                try:
                    y = skinny_matmul(x, ws[0], **cfg)
                    err = (y.float() - ref.float()).abs().max().item()
                    us = graph_ms(
                        lambda x=x, cfg=cfg, ws=ws, outs=outs: [
                            skinny_matmul(x, w, o, **cfg) for w, o in zip(ws, outs, strict=True)
                        ]
                    )
                except Exception as e:  # a config the GPU cannot run (shared memory): noted and skipped
                    print(json.dumps({"projection": name, "batch": m, **cfg, "error": str(e)[:200]}), flush=True)
                    continue
                us = us * 1000 / LAYERS
                pct = round(100 * n * k * 2 / (us / 1e6) / 1e9 / bw, 1)
                row = {"projection": name, "batch": m, **cfg, "us": round(us, 2), "pct_copy": pct}
                row["max_err"] = round(err, 4)
                points.append(row)
                print(json.dumps(row), flush=True)
                if sink:
                    sink.write(json.dumps(row) + "\n")
            top = min(points, key=lambda r: r["us"])
            summary = {"projection": name, "batch": m, **{f"{lib}_us": round(v, 2) for lib, v in base.items()},
                       "best": top}  # fmt: skip
            best.append(summary)
            print(json.dumps(summary), flush=True)
        ws = outs = []
        torch.cuda.empty_cache()
    print("BEST")
    for s in best:
        t = s["best"]
        cfg = {c: t[c] for c in ("BLOCK_N", "BLOCK_K", "num_stages", "num_warps", "SPLIT_K")}
        print(f"{s['projection']:8s} b{s['batch']:<3d} cublas {s['cublas_us']:7.2f} lt {s['cublaslt_us']:7.2f} "
              f"triton {t['us']:7.2f} ({t['pct_copy']}%) {cfg}")  # fmt: skip
    if sink:
        sink.write(json.dumps({"best": best}) + "\n")
        sink.close()


if __name__ == "__main__":
    main()
