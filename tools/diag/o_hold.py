"""A decode step's layers with the o projection loading its weight while decode attention runs.

At the 8B shape, batch b and context 1024: 32 layers, each with its own weights and KV pool,
each running what a folded decode step runs (qkv, decode attention with the new token and
the norm, o added into the residual, gate_up, silu_mul with the norm, down added into the
residual), captured in one CUDA graph and timed over its replays. o is run by cuBLAS (as the
engine does), by held_matvec_ after attention has finished, or by held_matvec_ launched with
PDL behind a decode attention that lets it start at once (config rows/hold/chunk/warps/prefetch/early_y/evict
first).
Each mode's residual after one pass of the 32 layers is compared with cuBLAS's. Prints one
JSON line per batch and round: µs per layer for qkv + attention + o, and for the whole layer.

    python3 tools/diag/o_hold.py [--batches 1,2,4] [--rounds 2] [--configs 32/16/8/8/1,16/8/8/8/1]
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
from services.worker.kernels.held_matvec import held_matvec_
from services.worker.kernels.silu_mul import silu_mul
from services.worker.ops import RowNorm
from tools.diag.decode_rotary import HIDDEN, decode_setup, each_batch
from tools.diag.decode_small import HKV, HQ, LAYERS, D

INTER = 14336


def weights(dev: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's (qkv, o, gate_up, down) weights [N, K], bf16, small enough to keep the
    residual finite over many replays."""
    shapes = ((HIDDEN + 2 * HKV * D, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))
    return [tuple(torch.randn(s, dtype=torch.bfloat16, device=dev) * s[1] ** -0.5 * 0.1 for s in shapes)
            for _ in range(LAYERS)]  # fmt: skip


def layers(ws: list, pools: list, call: tuple, store: tuple, common: dict, bufs: dict, mode: str,
           whole: bool) -> None:  # fmt: skip
    _, table, rows, lens, grid = call
    _, _, cos_sin, slots = store
    x, qkv, attn, gu, act = bufs["x"], bufs["qkv"], bufs["attn"], bufs["gu"], bufs["act"]
    b = x.shape[0]
    norm = RowNorm(x, 1e-5)
    fields = ("rows", "hold", "chunk", "num_warps", "prefetch", "early_y", "evict")
    held = (
        None if mode in ("cublas", "cublas_pdl", "plain") else dict(zip(fields, map(int, mode.split("/")), strict=True))
    )
    for (w_qkv, w_o, w_gu, w_down), (kp, vp) in zip(ws, pools, strict=True):
        torch.mm(x, w_qkv.t(), out=qkv)
        q = qkv[:, :HIDDEN].view(b, HQ, D)
        k = qkv[:, HIDDEN : HIDDEN + HKV * D].view(b, HKV, D)
        v = qkv[:, HIDDEN + HKV * D :].view(b, HKV, D)
        decode_attention(q, kp, vp, table, rows, lens, D**-0.5, grid, new=NewTokens(k, v, cos_sin, slots, norm),
                         pdl=held is not None or mode == "cublas_pdl", **(common | {"out": attn}))  # fmt: skip
        if mode in ("cublas", "cublas_pdl"):
            x.addmm_(attn.view(b, HIDDEN), w_o.t())
        elif mode == "plain":
            held_matvec_(x, attn.view(b, HIDDEN), w_o, hold=8)
        else:
            held_matvec_(
                x,
                attn.view(b, HIDDEN),
                w_o,
                pdl=True,
                **{
                    **held,
                    "prefetch": bool(held["prefetch"]),
                    "early_y": bool(held["early_y"]),
                    "evict": "evict_first" if held["evict"] else "",
                },
            )
        if not whole:
            continue
        torch.mm(x, w_gu.t(), out=gu)
        silu_mul(gu, out=act, norm=norm)
        x.addmm_(act, w_down.t())


def batch_rows(b: int, ctx: int, rounds: int, modes: list[str], cos_sin: torch.Tensor, sms: int,
               ws: list) -> list[dict]:  # fmt: skip
    dev, bf = cos_sin.device, torch.bfloat16
    grid = choose_num_splits(b, HKV, 1 << 30, sms)
    pools, call, store, common = decode_setup(b, ctx, grid, cos_sin)
    bufs = {name: torch.empty(b, n, dtype=bf, device=dev) for name, n in
            (("qkv", HIDDEN + 2 * HKV * D), ("gu", 2 * INTER), ("act", INTER))}  # fmt: skip
    x0 = torch.randn(b, HIDDEN, dtype=bf, device=dev)
    bufs["x"] = x0.clone()
    bufs["attn"] = torch.empty(b, HQ, D, dtype=bf, device=dev)
    # one pass of each mode from the same residual, against cuBLAS's
    found = {}
    for mode in modes:
        bufs["x"].copy_(x0)
        layers(ws, pools, call, store, common, bufs, mode, True)
        found[mode] = bufs["x"].float().clone()
    ref = found["cublas"]
    err = {m: round(((f - ref).norm() / ref.norm()).item(), 5) for m, f in found.items()}
    out = []
    for r in range(rounds):
        row = {"batch": b, "context": ctx, "splits": grid, "round": r, "rel_err": err}
        for whole, part in ((False, "attn_o"), (True, "layer")):
            for mode in modes:
                run = functools.partial(layers, ws, pools, call, store, common, bufs, mode, whole)
                row[f"{part}_{mode}_us"] = round(graph_ms(run, reps=20) * 1000 / LAYERS, 2)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--configs", default="32/16/16/8/1/1/0,32/16/16/8/0/1/0,16/8/8/8/1/1/0,16/8/8/8/1/1/1")
    args = ap.parse_args()
    ws = weights(torch.device("cuda"))

    def rows(b: int, cos_sin: torch.Tensor, sms: int) -> dict:
        configs = [c for c in args.configs.split(",") if b == 1 or int(c.split("/")[1]) <= 8]  # 16 held spill at b > 1
        found = batch_rows(b, args.context, args.rounds, ["cublas", "cublas_pdl", "plain", *configs], cos_sin, sms, ws)
        for row in found[:-1]:
            print(json.dumps(row), flush=True)
        return found[-1]

    each_batch(args.batches, args.context, rows)


if __name__ == "__main__":
    main()
