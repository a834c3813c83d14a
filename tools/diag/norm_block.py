"""The folded norm's factor read in one load or in tiles, and decode attention's split grid at
small batches.

A decode step of up to 64 requests computes each row's inverse RMS inside decode attention
and silu_mul (ops.RowNorm), from the residual row, NORM_BLOCK elements at a time. Each tile's
load is waited for before the next is asked for, so a row of 4096 in tiles of 1024 is four
memory round trips on every program's path. At the 8B shape and context 1024, for each
batch and each NORM_BLOCK listed: 32 layers of decode attention (new tokens rotated and
stored, folded norm, each layer on its own KV pool) and 32 of silu_mul (folded norm), each
captured in one CUDA graph, timed over its replays. With --grids, decode attention also runs
with each split grid listed (the last split combining them when there are at most
FUSE_MAX_SPLITS) next to the engine's; with --silu-blocks, silu_mul with each tile listed.
Prints one JSON line per batch: µs per layer.

    python3 tools/diag/norm_block.py [--batches 1,4,16,64] [--blocks 1024,4096] [--grids 8,16]
        [--silu-blocks 512,2048]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.blas_choice import graph_ms
from services.worker.kernels import decode_attention as attention_module
from services.worker.kernels import silu_mul as silu_module
from services.worker.kernels.decode_attention import NewTokens, choose_num_splits
from services.worker.kernels.silu_mul import silu_mul
from services.worker.ops import RowNorm
from tools.diag.decode_rotary import HIDDEN, decode_setup, each_batch, fused
from tools.diag.decode_small import HKV, LAYERS

INTER = 14336


def silu_layers(gate_ups: list, out: torch.Tensor, norm: RowNorm) -> None:
    for gate_up in gate_ups:
        silu_mul(gate_up, out=out, norm=norm)


def attention_us(b: int, ctx: int, grid: int, cos_sin: torch.Tensor, norm: RowNorm) -> float:
    pools, call, store, common = decode_setup(b, ctx, grid, cos_sin)
    run = functools.partial(fused, pools, call, NewTokens(*store, norm), common)
    return round(graph_ms(run) * 1000 / LAYERS, 2)


def batch_row(ctx: int, blocks: list[int], grids: list[int], silu_blocks: list[int], b: int, cos_sin: torch.Tensor,
              sms: int) -> dict:  # fmt: skip
    dev, bf = cos_sin.device, torch.bfloat16
    norm = RowNorm(torch.randn(b, HIDDEN, dtype=bf, device=dev), 1e-5)
    engine_grid = choose_num_splits(b, HKV, 1 << 30, sms)  # as a captured graph's (decode_max_len unbounded)
    gate_ups = [torch.randn(b, 2 * INTER, dtype=bf, device=dev) for _ in range(LAYERS)]
    out = torch.empty(b, INTER, dtype=bf, device=dev)
    row: dict = {"batch": b, "context": ctx, "engine_grid": engine_grid}
    for block in blocks:
        attention_module.NORM_BLOCK = block
        silu_module.NORM_BLOCK = block
        row[f"attention_block{block}_us"] = attention_us(b, ctx, engine_grid, cos_sin, norm)
        row[f"silu_mul_block{block}_us"] = round(graph_ms(functools.partial(silu_layers, gate_ups, out, norm))
                                                  * 1000 / LAYERS, 2)  # fmt: skip
        for grid in grids:
            if grid != engine_grid:
                row[f"attention_block{block}_grid{grid}_us"] = attention_us(b, ctx, grid, cos_sin, norm)
        engine_tile = silu_module.BLOCK
        for tile in silu_blocks:
            silu_module.BLOCK = tile
            run = functools.partial(silu_layers, gate_ups, out, norm)
            row[f"silu_mul_block{block}_tile{tile}_us"] = round(graph_ms(run) * 1000 / LAYERS, 2)
        silu_module.BLOCK = engine_tile
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--blocks", default="1024,4096", help="NORM_BLOCK values (silu_mul's capped at the row)")
    ap.add_argument("--grids", default="", help="split grids of decode attention to time besides the engine's")
    ap.add_argument("--silu-blocks", default="", help="silu_mul tiles to time besides the engine's")
    args = ap.parse_args()
    blocks = [int(x) for x in args.blocks.split(",")]
    grids = [int(x) for x in args.grids.split(",") if x]
    silu_blocks = [int(x) for x in args.silu_blocks.split(",") if x]
    each_batch(args.batches, args.context, functools.partial(batch_row, args.context, blocks, grids, silu_blocks))


if __name__ == "__main__":
    main()
