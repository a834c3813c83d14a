"""A decode step's chain of projections at small batches, by who runs them: cuBLAS, the skinny
matmul kernel, or the kernel launched with programmatic dependent launch (PDL), with and
without prefetching its first weight columns before it waits. GPU (Hopper) only.

Each layer runs qkv -> o -> gate_up -> down on the Llama-3-8B shapes, each product's input
being (a slice of) the one before's output, as in a step; with --small, the add_rmsnorm and
silu_mul kernels sit between them as in the model. 32 layers' own weights are captured in one
CUDA graph; ms per replay of the whole chain.

    python3 tools/diag/pdl_chain.py [--batches 1,2,4] [--small]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch

from services.worker.kernels.add_rmsnorm import add_rmsnorm_
from services.worker.kernels.silu_mul import silu_mul
from services.worker.kernels.skinny_matmul import skinny_matmul
from tools.bench_blas import SHAPES, graph_ms

LAYERS = 32
# the r75 sweep's best config per projection at batch 1
CONFIGS = {
    "qkv": {"BLOCK_N": 64, "BLOCK_K": 128, "num_stages": 3, "num_warps": 4, "SPLIT_K": 4},
    "o": {"BLOCK_N": 32, "BLOCK_K": 128, "num_stages": 3, "num_warps": 4, "SPLIT_K": 4},
    "gate_up": {"BLOCK_N": 64, "BLOCK_K": 128, "num_stages": 5, "num_warps": 4, "SPLIT_K": 1},
    "down": {"BLOCK_N": 64, "BLOCK_K": 256, "num_stages": 3, "num_warps": 4, "SPLIT_K": 4},
}
MODES = {  # name -> (projections on cuBLAS, PDL, PREFETCH)
    "cublas": (set(SHAPES), False, 0),
    "triton": (set(), False, 0),
    "triton_pdl": (set(), True, 0),
    "triton_pdl_pf256": (set(), True, 256),
    "triton_pdl_pf1024": (set(), True, 1024),
    "gate_up_cublas_pdl_pf256": ({"gate_up"}, True, 256),
}


def chain(x, weights, norm_w, small: bool, mode: str):
    on_blas, pdl, prefetch = MODES[mode]
    residual = torch.zeros_like(x)

    def proj(name, a, w):
        if name in on_blas:
            return a @ w.t()
        return skinny_matmul(a, w, pdl=pdl, **CONFIGS[name], **({"PREFETCH": prefetch} if pdl else {}))

    h = x
    for layer in weights:
        a = add_rmsnorm_(h, residual, norm_w, 1e-5) if small else h
        qkv = proj("qkv", a, layer["qkv"])
        o = proj("o", qkv[:, :4096], layer["o"])
        a = add_rmsnorm_(o, residual, norm_w, 1e-5) if small else o
        gu = proj("gate_up", a, layer["gate_up"])
        a = silu_mul(gu) if small else gu[:, :14336]
        h = proj("down", a, layer["down"])
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--small", action="store_true", help="add_rmsnorm and silu_mul between the products")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pdl_chain.py needs a CUDA GPU")
    bf = torch.bfloat16
    weights = [{n: torch.randn(*SHAPES[n], device="cuda", dtype=bf) / SHAPES[n][1] ** 0.5 for n in SHAPES}
               for _ in range(LAYERS)]  # fmt: skip
    norm_w = torch.ones(4096, device="cuda", dtype=bf)
    for m in (int(b) for b in args.batches.split(",")):
        x = torch.randn(m, 4096, device="cuda", dtype=bf)
        ref = chain(x, weights, norm_w, args.small, "cublas").float()
        row = {"batch": m, "small": args.small}
        for mode in MODES:
            got = chain(x, weights, norm_w, args.small, mode).float()
            row[f"{mode}_ms"] = round(graph_ms(lambda mode=mode, x=x: chain(x, weights, norm_w, args.small, mode)), 4)
            row[f"{mode}_rel_err"] = round(((got - ref).norm() / ref.norm()).item(), 4)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
