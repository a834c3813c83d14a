"""Decode attention at small batches, by launch config: what a lone request's attention costs.

Each point is 32 calls, one per layer, each on its own KV pool (so the 4 MB a request reads
at context 1024 is not left in L2 by the call before, as a layer's never is in a real step),
captured in one CUDA graph with the grid the engine's graphs use (32 splits) and timed over
its replays. Prints one JSON line per point, then the best per batch.

    python3 tools/diag/decode_small.py [--batches 1,4,16] [--context 1024] [--tokens 32,64,128,256,one]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.blas_choice import graph_ms
from services.worker.kernels.decode_attention import MAX_SPLITS, decode_attention, decode_scratch

LAYERS, HQ, HKV, D = 32, 32, 8, 128


def graph_us(fn, reps: int = 20) -> float:
    """µs per layer of fn (all the layers' calls) replayed from a graph."""
    return graph_ms(fn, reps) * 1000 / LAYERS


def layer_pools(b: int, ctx: int, dev: torch.device) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor]:
    """b requests of context ctx at scattered slots: (each layer's (k, v) pool, the request
    table [b, ctx], rows, lengths)."""
    cap, bf = b * ctx + 1, torch.bfloat16
    pools = [(torch.randn(cap, HKV, D, dtype=bf, device=dev), torch.randn(cap, HKV, D, dtype=bf, device=dev))
             for _ in range(LAYERS)]  # fmt: skip
    return pools, *requests(b, ctx, dev)


def requests(b: int, ctx: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """b requests of context ctx at scattered slots of a pool of b * ctx + 1: (the request
    table [b, ctx], rows, lengths)."""
    table = torch.randperm(b * ctx, device=dev).view(b, ctx).to(torch.int32)
    rows = torch.arange(b, dtype=torch.int32, device=dev)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    return table, rows, lens


def layers(pools: list, call: tuple, cfg: dict) -> None:
    q, table, rows, lens, grid, out = call
    for k, v in pools:
        decode_attention(q, k, v, table, rows, lens, D**-0.5, grid, out=out, **cfg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", default="32,64,128,256,one", help="split_tokens to try; one: a single split")
    args = ap.parse_args()
    dev, bf, ctx = torch.device("cuda"), torch.bfloat16, args.context
    best = {}
    for b in (int(x) for x in args.batches.split(",")):
        pools, table, rows, lens = layer_pools(b, ctx, dev)
        q = torch.randn(b, HQ, D, dtype=bf, device=dev)
        out = torch.empty_like(q)
        tried = [1 << 20 if t == "one" else int(t) for t in args.tokens.split(",")]
        configs = itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3), tried)
        for bn, warps, stages, tokens in configs:
            if tokens < bn:
                continue
            grid = 1 if tokens == 1 << 20 else MAX_SPLITS
            mid_o, mid_lse = decode_scratch(b, HQ, D, grid, dev)
            cfg = {"split_tokens": tokens, "mid_o": mid_o, "mid_lse": mid_lse, "BLOCK_N": bn, "num_warps": warps,
                   "num_stages": stages}  # fmt: skip
            run = functools.partial(layers, pools, (q, table, rows, lens, grid, out), cfg)
            us = graph_us(run)
            row = {"batch": b, "context": ctx, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages,
                   "split_tokens": tokens if grid > 1 else "one split", "us_per_layer": round(us, 2)}  # fmt: skip
            print(json.dumps(row), flush=True)
            if b not in best or us < best[b]["us_per_layer"]:
                best[b] = row
        del pools
        torch.cuda.empty_cache()
    print(json.dumps({"best": best}), flush=True)


if __name__ == "__main__":
    main()
