"""Decode attention over an int8 KV pool against a bf16 one, by launch config.

Each point is 32 calls, one per layer, each on its own pool (so no layer finds its KV in L2),
captured in one CUDA graph with the split count an eager step would pick at that context
(choose_num_splits; the decode graphs' grid is fixed, and SPLIT_TOKENS bounds each request's
splits in it), the last split combining, and timed over its replays. A point's bytes are what
the kernel must read (bench_kernels.decode_bytes): K and V (and an int8 pool's two float32
scales a token and head), the slot table, q and the output. Prints one
JSON line per point (µs a layer, TB/s), then each compiled kernel's registers and spills,
which say whether a config fits.

    python3 tools/diag/decode_int8.py [--shapes 1x1024,64x1024,64x2048,256x1024]
        [--configs 64/4/2,64/2/3] [--bf16-configs 64/2/3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.kernels import decode_attention as da
from tools.bench_kernels import Shapes, decode_bytes
from tools.diag.decode_small import HKV, HQ, LAYERS, D, graph_us, requests


def pools(b: int, ctx: int, int8: bool, dev: torch.device) -> list[dict]:
    """Each layer's pool (and an int8 pool's scales) for b requests of context ctx."""
    cap = b * ctx + 1
    layers = []
    for _ in range(LAYERS):
        if int8:
            kv = {
                n: torch.randint(-127, 128, (cap, HKV, D), dtype=torch.int8, device=dev) for n in ("k_pool", "v_pool")
            }
            kv |= {n: torch.rand(cap, HKV, device=dev) / 64 for n in ("k_scale", "v_scale")}
        else:
            kv = {n: torch.randn(cap, HKV, D, dtype=torch.bfloat16, device=dev) for n in ("k_pool", "v_pool")}
        layers.append(kv)
    return layers


def run_layers(layers: list[dict], call: dict, cfg: dict) -> None:
    for kv in layers:
        da.decode_attention(**call, **kv, **cfg)


def compiled(kernel) -> list[dict]:
    """Registers, spills and launch shape of each compiled form of a Triton kernel."""
    rows = []
    for cache in kernel.device_caches.values():
        for k in cache[0].values():
            k._init_handles()
            md = k.metadata
            rows.append({"kernel": kernel.fn.__name__, "num_warps": md.num_warps, "num_stages": md.num_stages,
                         "n_regs": k.n_regs, "n_spills": k.n_spills, "shared": md.shared})  # fmt: skip
    return rows


def parse_configs(text: str) -> list[dict]:
    out = []
    for c in filter(None, text.split(",")):
        bn, w, s = (int(x) for x in c.split("/"))
        out.append({"BLOCK_N": bn, "num_warps": w, "num_stages": s})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x1024,64x1024,64x2048,256x1024")
    ap.add_argument("--configs", default="64/4/2,64/2/3,32/2/3,64/4/3,128/4/2,64/8/2", help="int8 pool's")
    ap.add_argument("--bf16-configs", default="64/2/3")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    for shape in args.shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        q = torch.randn(b, HQ, D, dtype=torch.bfloat16, device=dev)
        table, rows, lens = requests(b, ctx, dev)
        call = {"q": q, "req_table": table, "rows": rows, "seq_lens": lens, "scale": D**-0.5,
                "split_tokens": da.SPLIT_TOKENS, "out": torch.empty_like(q),
                "counts": torch.zeros(b * HKV, dtype=torch.int32, device=dev)}  # fmt: skip
        splits = da.choose_num_splits(b, HKV, ctx, num_sms)
        mid_o, mid_lse = da.decode_scratch(b, HQ, D, splits, dev)
        call |= {"num_splits": splits, "mid_o": mid_o, "mid_lse": mid_lse}
        for int8, configs in ((True, parse_configs(args.configs)), (False, parse_configs(args.bf16_configs))):
            layers = pools(b, ctx, int8, dev)
            nbytes = decode_bytes(Shapes(decode_batch=b), ctx, int8)
            for cfg in configs:
                run = functools.partial(run_layers, layers, call, cfg)
                us = [graph_us(run) for _ in range(args.rounds)]
                print(json.dumps({"batch": b, "context": ctx, "splits": splits, "kv": "int8" if int8 else "bf16",
                                  **cfg, "us_per_layer": [round(u, 2) for u in us],
                                  "TB/s": round(nbytes / min(us) / 1e6, 3)}), flush=True)  # fmt: skip
            del layers
            torch.cuda.empty_cache()
    for row in compiled(da._decode_split_kernel):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
