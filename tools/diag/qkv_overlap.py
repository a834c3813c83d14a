"""How much a batch-1 layer could gain if decode attention overlapped the qkv product.

Decode attention reads the request's cached K and V (all but the new token) without needing
qkv's output; only q and the new token's k and v come from it. This times 32 layers of a
folded decode step (as o_prefetch.py did): "serial" as the engine runs them, and "overlap_bound"
with decode attention on a second stream, forked before qkv and joined before o, not waiting
for qkv at all. The second is not a correct step (attention reads q while qkv writes it): it
bounds what any overlap of the two could gain, fork and join included. Also "attn_only": the
layers without the qkv product.

    python3 tools/diag/qkv_overlap.py [--batches 1,4] [--rounds 3]
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

from services.worker.blas_choice import graph_ms
from services.worker.kernels.decode_attention import NewTokens, choose_num_splits, decode_attention
from services.worker.kernels.silu_mul import silu_mul
from services.worker.ops import RowNorm
from tools.diag.decode_rotary import HIDDEN, decode_setup, each_batch
from tools.diag.decode_small import HKV, HQ, LAYERS, D

INTER = 14336


def weights(dev: torch.device) -> list[tuple[torch.Tensor, ...]]:
    shapes = ((HIDDEN + 2 * HKV * D, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))
    return [tuple(torch.randn(s, dtype=torch.bfloat16, device=dev) * s[1] ** -0.5 * 0.1 for s in shapes)
            for _ in range(LAYERS)]  # fmt: skip


def layers(ws: list, pools: list, call: tuple, store: tuple, common: dict, bufs: dict, mode: str,
           side: torch.cuda.Stream) -> None:  # fmt: skip
    _, table, rows, lens, grid = call
    _, _, cos_sin, slots = store
    x, qkv, attn, gu, act = bufs["x"], bufs["qkv"], bufs["attn"], bufs["gu"], bufs["act"]
    b = x.shape[0]
    norm = RowNorm(x, 1e-5)
    main = torch.cuda.current_stream()
    for (w_qkv, w_o, w_gu, w_down), (kp, vp) in zip(ws, pools, strict=True):
        q = qkv[:, :HIDDEN].view(b, HQ, D)
        k = qkv[:, HIDDEN : HIDDEN + HKV * D].view(b, HKV, D)
        v = qkv[:, HIDDEN + HKV * D :].view(b, HKV, D)
        attend = functools.partial(decode_attention, q, kp, vp, table, rows, lens, D**-0.5, grid,
                                   new=NewTokens(k, v, cos_sin, slots, norm), **(common | {"out": attn}))  # fmt: skip
        if mode == "overlap_bound":
            side.wait_stream(main)
            with torch.cuda.stream(side):
                attend()
            torch.mm(x, w_qkv.t(), out=qkv)
            main.wait_stream(side)
        else:
            if mode == "serial":
                torch.mm(x, w_qkv.t(), out=qkv)
            attend()
        x.addmm_(attn.view(b, HIDDEN), w_o.t())
        torch.mm(x, w_gu.t(), out=gu)
        silu_mul(gu, out=act, norm=norm)
        x.addmm_(act, w_down.t())


def batch_rows(b: int, ctx: int, rounds: int, cos_sin: torch.Tensor, sms: int, ws: list) -> list[dict]:
    dev, bf = cos_sin.device, torch.bfloat16
    grid = choose_num_splits(b, HKV, 1 << 30, sms)
    pools, call, store, common = decode_setup(b, ctx, grid, cos_sin)
    bufs = {name: torch.empty(b, n, dtype=bf, device=dev) for name, n in
            (("qkv", HIDDEN + 2 * HKV * D), ("gu", 2 * INTER), ("act", INTER))}  # fmt: skip
    bufs["x"] = torch.randn(b, HIDDEN, dtype=bf, device=dev)
    bufs["attn"] = torch.empty(b, HQ, D, dtype=bf, device=dev)
    side = torch.cuda.Stream()
    out = []
    for r in range(rounds):
        row = {"batch": b, "context": ctx, "splits": grid, "round": r}
        for mode in ("serial", "overlap_bound", "attn_only"):
            run = functools.partial(layers, ws, pools, call, store, common, bufs, mode, side)
            row[f"{mode}_us"] = round(graph_ms(run, reps=20) * 1000 / LAYERS, 2)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ws = weights(torch.device("cuda"))

    def rows(b: int, cos_sin: torch.Tensor, sms: int) -> dict:
        found = batch_rows(b, args.context, args.rounds, cos_sin, sms, ws)
        for row in found[:-1]:
            print(json.dumps(row), flush=True)
        return found[-1]

    each_batch(args.batches, args.context, rows)


if __name__ == "__main__":
    main()
