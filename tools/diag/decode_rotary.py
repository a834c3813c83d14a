"""Decode attention with the new token's rotary and KV store in it, against rotary_store first.

At the 8B shape and context 1024, for each batch: 32 layers, each on its own KV pool, captured
in one CUDA graph with the grid and split settings the engine's decode graphs use, timed over
its replays. "apart" is rotary_store_ then decode_attention (as before 408feff), "fused" is
decode_attention given the new tokens (NewTokens), under each launch config listed, with
--norm 1 a folded norm too (as the engine's decode steps of up to 64 requests). Prints one
JSON line per batch: µs per layer.

    python3 tools/diag/decode_rotary.py [--batches 1,4,16,64,256] [--configs 64/2/3,64/4/2] [--norm 1]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.attention.triton_backend import FUSE_MAX_SPLITS
from services.worker.blas_choice import graph_ms
from services.worker.kernels.decode_attention import (
    SPLIT_TOKENS,
    NewTokens,
    choose_num_splits,
    decode_attention,
    decode_scratch,
)
from services.worker.kernels.rotary_store import rotary_store_
from services.worker.models.rope import cos_sin_table
from services.worker.ops import RowNorm
from tools.diag.decode_small import HKV, HQ, LAYERS, D, layer_pools

HIDDEN = HQ * D  # the residual row a folded norm reads (4096 at the 8B shape)


def apart(pools: list, call: tuple, store: tuple, common: dict) -> None:
    """Each layer: rotary_store_, then decode attention over the pool it stored into."""
    q, table, rows, lens, grid = call
    k, v, cos_sin, slots = store
    positions = (lens - 1).long()
    for kp, vp in pools:
        rotary_store_(q, k, v, positions, cos_sin, kp, vp, slots)
        decode_attention(q, kp, vp, table, rows, lens, D**-0.5, grid, **common)


def fused(pools: list, call: tuple, new: NewTokens, common: dict) -> None:
    """Each layer: decode attention that rotates and stores the new tokens itself."""
    q, table, rows, lens, grid = call
    for kp, vp in pools:
        decode_attention(q, kp, vp, table, rows, lens, D**-0.5, grid, new=new, **common)


def decode_setup(b: int, ctx: int, grid: int, cos_sin: torch.Tensor) -> tuple[list, tuple, tuple, dict]:
    """b requests of ctx tokens in each of 32 layers' pools, with a split grid of grid: (the pools,
    the call's (q, table, rows, lens, grid), the new tokens' (k, v, cos_sin, slots), the keyword
    arguments every call shares: scratch, and counts when the last split combines)."""
    dev, bf = cos_sin.device, torch.bfloat16
    pools, table, rows, lens = layer_pools(b, ctx, dev)
    slots = table[:, ctx - 1].clone()
    qkv = torch.randn(b, HQ + 2 * HKV, D, dtype=bf, device=dev)
    q, k, v = qkv[:, :HQ], qkv[:, HQ : HQ + HKV], qkv[:, HQ + HKV :]
    mid_o, mid_lse = decode_scratch(b, HQ, D, grid, dev)
    counts = torch.zeros(b * HKV, dtype=torch.int32, device=dev) if 1 < grid <= FUSE_MAX_SPLITS else None
    common = {"split_tokens": SPLIT_TOKENS, "out": torch.empty_like(q), "mid_o": mid_o, "mid_lse": mid_lse,
              "counts": counts}  # fmt: skip
    return pools, (q, table, rows, lens, grid), (k, v, cos_sin, slots), common


def batch_row(b: int, ctx: int, configs: list[str], cos_sin: torch.Tensor, sms: int, with_norm: bool = False) -> dict:
    dev, bf = cos_sin.device, torch.bfloat16
    grid = choose_num_splits(b, HKV, 1 << 30, sms)  # as a captured graph's (decode_max_len unbounded)
    pools, call, store, common = decode_setup(b, ctx, grid, cos_sin)
    row = {"batch": b, "context": ctx, "splits": grid}
    row["apart_us"] = round(graph_ms(functools.partial(apart, pools, call, store, common)) * 1000 / LAYERS, 2)
    # the layer's norm folded into the QKV weights, as the engine's decode steps of up to 64 run
    norm = RowNorm(torch.randn(b, HIDDEN, dtype=bf, device=dev), 1e-5) if with_norm else None
    for spec in configs:
        bn, warps, stages = (int(x) for x in spec.split("/"))
        cfg = common | {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
        run = functools.partial(fused, pools, call, NewTokens(*store, norm), cfg)
        row[f"fused_{spec}_us"] = round(graph_ms(run) * 1000 / LAYERS, 2)
    return row


def each_batch(batches: str, context: int, row: Callable[[int, torch.Tensor, int], dict]) -> None:
    """On the GPU, for each batch of the comma list: print row(batch, cos_sin, sms) as one JSON line,
    cos_sin the rope table of the 8B shape up to context + 1 positions, sms the GPU's SM count."""
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cos_sin = cos_sin_table(D, 500000.0, {}, context + 1, dev)
    for b in (int(x) for x in batches.split(",")):
        print(json.dumps(row(b, cos_sin, sms)), flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,16,64,256")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--configs", default="64/2/3,64/4/2,32/2/3", help="BLOCK_N/num_warps/num_stages of the fused")
    ap.add_argument("--norm", type=int, default=0, help="1: with a folded norm (a RowNorm of hidden 4096)")
    args = ap.parse_args()
    configs = args.configs.split(",")
    each_batch(args.batches, args.context,
               lambda b, cos_sin, sms: batch_row(b, args.context, configs, cos_sin, sms, bool(args.norm)))  # fmt: skip


if __name__ == "__main__":
    main()
