"""A decode step's layers with decode attention asking L2 for the o projection's weight.

At the 8B shape, batch b and context 1024: 32 layers, each with its own weights and KV pool,
each running what a folded decode step runs (qkv, decode attention with the new token and
the norm, o added into the residual, gate_up, silu_mul with the norm, down added into the
residual), captured in one CUDA graph and timed over its replays. Modes, alternated for
--rounds rounds: decode attention without a prefetch, with each program asking L2 for its
share of W_o at its start (start), at its end (end), or for the first half of W_o only
(start_half). Prints one JSON line per batch and round: µs per layer.

    python3 tools/diag/o_prefetch.py [--batches 1,2,4] [--rounds 3]
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
MODES = {"none": (0, 1.0), "start": (1, 1.0), "end": (2, 1.0), "start_half": (1, 0.5)}


def weights(dev: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's (qkv, o, gate_up, down) weights [N, K], bf16, small enough to keep the
    residual finite over many replays."""
    shapes = ((HIDDEN + 2 * HKV * D, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))
    return [tuple(torch.randn(s, dtype=torch.bfloat16, device=dev) * s[1] ** -0.5 * 0.1 for s in shapes)
            for _ in range(LAYERS)]  # fmt: skip


def layers(ws: list, pools: list, call: tuple, store: tuple, common: dict, bufs: dict, mode: str,
           upto: int = 4) -> None:  # fmt: skip
    _, table, rows, lens, grid = call
    _, _, cos_sin, slots = store
    x, qkv, attn, gu, act = bufs["x"], bufs["qkv"], bufs["attn"], bufs["gu"], bufs["act"]
    b = x.shape[0]
    at, frac = MODES[mode]
    norm = RowNorm(x, 1e-5)
    for (w_qkv, w_o, w_gu, w_down), (kp, vp) in zip(ws, pools, strict=True):
        torch.mm(x, w_qkv.t(), out=qkv)
        q = qkv[:, :HIDDEN].view(b, HQ, D)
        k = qkv[:, HIDDEN : HIDDEN + HKV * D].view(b, HKV, D)
        v = qkv[:, HIDDEN + HKV * D :].view(b, HKV, D)
        pf = w_o[: int(w_o.shape[0] * frac)] if at else None
        decode_attention(q, kp, vp, table, rows, lens, D**-0.5, grid, new=NewTokens(k, v, cos_sin, slots, norm),
                         prefetch=pf, prefetch_at=at or 1, **(common | {"out": attn}))  # fmt: skip
        if upto < 2:
            continue
        x.addmm_(attn.view(b, HIDDEN), w_o.t())
        if upto < 3:
            continue
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
    out = []
    for r in range(rounds):
        row = {"batch": b, "context": ctx, "splits": grid, "round": r}
        for upto, part in ((1, "attn"), (2, "attn_o"), (4, "layer")):
            for mode in MODES:
                run = functools.partial(layers, ws, pools, call, store, common, bufs, mode, upto)
                row[f"{part}_{mode}_us"] = round(graph_ms(run, reps=20) * 1000 / LAYERS, 2)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4")
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
