"""Where a batch-1 layer's time goes between decode attention and gate_up, per kernel (o_hold.py's modes).

Builds o_hold.py's 32 layers at batch 1, context 1024, captures each mode named on the command
line in a CUDA graph, and profiles one replay (torch.profiler, CUDA activity). For layers 3-29 it
averages, in µs from the start of decode attention's split kernel: its duration, the end of the
reduce, the end of the o product (with cuBLAS's split-K reduce); and the qkv and gate_up kernels'
durations. One JSON line per mode.

    python3 tools/diag/o_hold_prof.py cublas cublas_pdl 16/8/8/8/1/1/0
"""

import functools
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
from torch.profiler import ProfilerActivity, profile

from services.worker.kernels.decode_attention import choose_num_splits
from services.worker.models.rope import cos_sin_table
from tools.diag.decode_rotary import decode_setup
from tools.diag.decode_small import HKV, HQ, D
from tools.diag.o_hold import HIDDEN, INTER, layers, weights

dev = torch.device("cuda")
bf = torch.bfloat16
cos_sin = cos_sin_table(D, 500000.0, {}, 1025, dev)
ws = weights(dev)
b = 1
grid = choose_num_splits(b, HKV, 1 << 30, 132)
pools, call, store, common = decode_setup(b, 1024, grid, cos_sin)
bufs = {
    n: torch.empty(b, k, dtype=bf, device=dev)
    for n, k in (("qkv", HIDDEN + 2 * HKV * D), ("gu", 2 * INTER), ("act", INTER))
}
bufs["x"] = torch.randn(b, HIDDEN, dtype=bf, device=dev)
bufs["attn"] = torch.empty(b, HQ, D, dtype=bf, device=dev)
for mode in sys.argv[1:]:
    run = functools.partial(layers, ws, pools, call, store, common, bufs, mode, True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        run()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        g.replay()
        torch.cuda.synchronize()
    evs = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ks = sorted([(e.time_range.start, e.time_range.end, e.name) for e in evs if "Memcpy" not in e.name])
    names = [k[2] for k in ks]
    rows = []
    for i, n in enumerate(names):
        if n.startswith("_decode_split_kernel"):
            j = next(j for j in range(i, len(names)) if names[j].startswith("_silu_mul"))
            red = [k for k in ks[i:j] if k[2].startswith("_decode_reduce")]
            rows.append(
                (
                    ks[i][1] - ks[i][0],
                    (red[0][1] - ks[i][0]) if red else 0.0,
                    ks[j - 2][1] - ks[i][0],
                    ks[i - 1][1] - ks[i - 1][0],
                    ks[j - 1][1] - ks[j - 1][0],
                )
            )
    rows = rows[2:-2]
    avg = [round(sum(r[c] for r in rows) / len(rows), 2) for c in range(5)]
    print(
        json.dumps(
            {
                "mode": mode,
                "split_us": avg[0],
                "reduce_end_us": avg[1],
                "o_end_us": avg[2],
                "qkv_us": avg[3],
                "gate_up_us": avg[4],
            }
        ),
        flush=True,
    )
