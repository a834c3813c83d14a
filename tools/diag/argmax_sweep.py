"""The split argmax (kernels/argmax.py) by tile, warps and programs an SM, on a CUDA GPU.

Each point launches the split and combine kernels on 20 different [rows, 128256] logit arrays
(so no call finds its row in L2), replayed from one CUDA graph 10 times; it reports µs a call
and checks every result against torch.argmax. What chose argmax.py's BLOCK and WARPS
(docs/benchmarks.md, r109).

    python3 tools/diag/argmax_sweep.py OUT.json [--rows 1,64,256]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from services.worker.kernels import argmax as am
from services.worker.kernels.launch import cdiv, next_pow2

VOCAB = 128256
ARRAYS = 20


def _launcher(x: torch.Tensor, block: int, warps: int, per_sm: int, sms: int):
    """-> (a call of both kernels on x, the output it writes)."""
    rows, cols = x.shape
    splits = max(1, min(cdiv(per_sm * sms, rows), cols // (2 * block), am.MAX_SPLITS))
    chunk = cdiv(cdiv(cols, splits), block) * block
    splits = cdiv(cols, chunk)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    vals = torch.empty(rows, splits, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, splits, dtype=torch.int32, device=x.device)

    def call() -> None:
        am._split_launch[(rows, splits)](x, vals, idx, x.stride(0), cols, chunk, splits, NO_INDEX=am._NO_INDEX,
                                         BLOCK=block, WRITE_VAL=True, num_warps=warps)  # fmt: skip
        am._combine_launch[(rows,)](vals, idx, out, splits, NO_INDEX=am._NO_INDEX, BLOCK_S=next_pow2(splits),
                                    num_warps=1)  # fmt: skip

    return call, out


def time_point(xs: list[torch.Tensor], block: int, warps: int, per_sm: int, sms: int) -> float:
    calls = [_launcher(x, block, warps, per_sm, sms) for x in xs]
    for call, _ in calls:
        call()
    torch.cuda.synchronize()
    for (_, out), x in zip(calls, xs, strict=True):
        if not torch.equal(out, x.argmax(dim=-1)):
            raise AssertionError(f"argmax differs from torch's at block {block}, warps {warps}, {per_sm} an SM")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call, _ in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (10 * len(xs))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--rows", default="1,64,256")
    args = ap.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = []
    for dtype, rows in itertools.product((torch.float32, torch.bfloat16), (int(r) for r in args.rows.split(","))):
        xs = [torch.randn(rows, VOCAB, device="cuda").to(dtype) for _ in range(ARRAYS)]
        here = []
        for block, warps, per_sm in itertools.product((1024, 2048, 4096), (4, 8), (4, 8, 16, 32)):
            us = time_point(xs, block, warps, per_sm, sms)
            here.append({"dtype": str(dtype), "rows": rows, "block": block, "warps": warps, "per_sm": per_sm,
                         "us": round(us, 2)})  # fmt: skip
        print("argmax", dtype, rows, "fastest", min(here, key=lambda r: r["us"]), flush=True)
        res += here
    with open(args.out, "w") as f:
        json.dump(res, f, indent=0)
    return res


if __name__ == "__main__":
    main()
