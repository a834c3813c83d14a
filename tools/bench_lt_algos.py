"""Every algorithm cuBLASLt's heuristic offers for a decode step's projections, timed against what
PyTorch's matmul runs (cuBLAS, and cuBLASLt's first choice), at the Llama-3-8B shape. GPU only.

    python tools/bench_lt_algos.py --out FILE.json [--batches 1,64,256] [--count 64] [--layers 32] [--seeds 3]

As in bench_blas.py, each projection's weights are drawn for every layer (the L2 cache cannot
hold them) and all layers' products are captured in one CUDA graph whose replays are timed.
Each algorithm's result is checked against PyTorch's before it is timed. With --seeds N, the
algorithms one setting away from the N fastest offered ones (split-K count, tile, cluster shape;
cublaslt.py's neighbours) are timed too. One JSON line per
(projection, batch): µs per layer for cuBLAS, cuBLASLt's default and the fastest algorithm,
and what the fastest would save a decode step (32 layers; the LM head once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from services.worker.runtime.blas_choice import LIBRARIES, time_choice
from services.worker.runtime.cublaslt import Algo, CublasLt
from tools.bench_blas import SHAPES, copy_gbps

PROJECTIONS = SHAPES | {"lm_head": (128256, 4096)}


def close(got: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool(((got.float() - ref.float()).norm() / ref.float().norm()).item() < 1e-2)


def time_projection(lt: CublasLt, x: torch.Tensor, ws: list[torch.Tensor], count: int, seeds: int) -> dict:
    """µs per product for cuBLAS, cuBLASLt's default and each offered algorithm over every w; then
    (seeds > 0) each neighbour of the fastest seeds algorithms (another split-K, tile or cluster)."""
    outs = [torch.empty(x.shape[0], w.shape[0], device="cuda", dtype=x.dtype) for w in ws]
    pairs = list(zip(ws, outs, strict=True))
    ref = x @ ws[0].t()
    row: dict = {}
    for lib in LIBRARIES:
        row[f"{lib}_us"] = round(time_choice(lib, lt, x, pairs, 10) * 1000 / len(ws), 2)

    def time_algos(algos: list[Algo]) -> tuple[list[dict], int]:
        timed, wrong = [], 0
        for a in algos:
            try:
                if not close(lt.matmul(x, ws[0], outs[0], a), ref):
                    wrong += 1
                    continue
                us = time_choice(a, lt, x, pairs, 5) * 1000 / len(ws)
            except RuntimeError as e:  # an algorithm the call refuses: noted, not timed
                timed.append({"algo": a.describe(), "error": str(e)})
                continue
            timed.append({"algo": a.describe(), "us": round(us, 2), "waves": round(a.waves, 2), "a": a})
        return timed, wrong

    algos = lt.algos(x, ws[0], outs[0], count)
    timed, wrong = time_algos(algos)
    ok = sorted((t for t in timed if "us" in t), key=lambda t: t["us"])
    first = [t["us"] for t in timed if t["algo"].startswith("#0 ") and "us" in t]
    row |= {"algos": len(algos), "wrong": wrong, "errors": sum("error" in t for t in timed)}
    if ok:
        row |= {"heuristic_best_us": ok[0]["us"], "lt_first_us": first[0] if first else None}
    if seeds and ok:
        near = {n.words: n for t in ok[:seeds] for n in lt.neighbours(x, ws[0], outs[0], t["a"])}
        near_timed, near_wrong = time_algos(list(near.values()))
        row |= {
            "neighbours": len(near),
            "neighbours_wrong": near_wrong,
            "neighbours_errors": sum("error" in t for t in near_timed),
        }
        ok = sorted(ok + [t for t in near_timed if "us" in t], key=lambda t: t["us"])
    if ok:
        row |= {"best_us": ok[0]["us"], "best": ok[0]["algo"]}
    row["timed"] = [{k: v for k, v in t.items() if k != "a"} for t in ok[:12]]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--projections", default=",".join(PROJECTIONS))
    ap.add_argument("--count", type=int, default=64, help="algorithms asked of the heuristic")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=0, help="search around this many of the fastest offered algorithms")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_lt_algos.py needs a CUDA GPU")
    lt = CublasLt(torch.device("cuda"))
    bw = copy_gbps()
    print(json.dumps({"copy_GBps": round(bw, 1)}), flush=True)
    rows, saved = [], {}
    for name in args.projections.split(","):
        n, k = PROJECTIONS[name]
        layers = 1 if name == "lm_head" else args.layers
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(layers)]
        for m in (int(b) for b in args.batches.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"projection": name, "batch": m, "bytes_us": round(n * k * 2 / bw / 1e3, 2)}
            row |= time_projection(lt, x, ws, args.count, args.seeds)
            torch_best = min(row["cublas_us"], row["cublaslt_us"])
            if "best_us" in row:
                row["saves_ms_per_step"] = round(max(0.0, torch_best - row["best_us"]) * layers / 1000, 4)
                saved[m] = saved.get(m, 0.0) + row["saves_ms_per_step"]
            row["pct_copy_best"] = round(100 * row["bytes_us"] / min(torch_best, row.get("best_us", torch_best)), 1)
            print(json.dumps({key: v for key, v in row.items() if key != "timed"}), flush=True)
            rows.append(row)
        ws.clear()
        torch.cuda.empty_cache()
    summary = {"saves_ms_per_step_by_batch": {str(m): round(v, 4) for m, v in saved.items()}}
    print(json.dumps(summary), flush=True)
    with open(args.out, "w") as f:
        json.dump(
            {"gpu": torch.cuda.get_device_name(), "copy_GBps": bw, "torch": torch.__version__, "rows": rows} | summary,
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
