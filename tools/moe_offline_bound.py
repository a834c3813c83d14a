"""How fast any bf16 engine on one GPU could run bench_families' offline job for a mixture of
experts: the weight-read floor of its decode steps, and the ratio over the peer it bounds.

    python tools/moe_offline_bound.py --shape mixtral-8x7b --requests 128 --copy-gbps 4297 \
        --prefill-s 2.58 --peer-req-per-s 0.889 [--engine-req-per-s 4.63]

The job sends the first N requests of sharegpt_shaped at once (ignore_eos, so each runs its
output length); the engine admits them all, so after the prefill step t runs every request with
more than t output tokens, and there is one decode step fewer than the longest output has tokens
(the prefill step gives each request its first). A step of b
tokens reads, in each layer, every expert some token routes to: with top-k of E experts and
uniform routing (random weights route about uniformly), an expert is missed by one token with
probability (E - k) / E, so E * (1 - ((E - k) / E) ** b) experts are read on average. It also
reads the rest of the weights (attention, the router, the output layer) and each running
request's KV. Those bytes at the GPU's copy rate are the decode floor; with the prefill as the
run measured it, the job cannot finish sooner, so N over that time bounds requests/s, and over
the peer's requests/s in the same job, the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from services.worker.models.bench_shapes import SHAPES
from tools.workload import sharegpt_shaped

BF16 = 2  # bytes


def shape_bytes(cfg: dict) -> dict[str, float]:
    """An MoE config.json's bytes: one expert's (gate, up, down) in one layer, the rest of the
    weights a decode step reads (attention, router, output layer), a token's KV over all layers."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    experts = cfg.get("num_local_experts") or cfg["num_experts"]
    inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    attention = h * (q + 2 * kv) + q * h + h * experts
    return {
        "expert": 3 * h * inter * BF16,
        "rest": (layers * attention + cfg["vocab_size"] * h) * BF16,
        "kv_token": layers * 2 * kv * BF16,
        "experts": experts,
        "top_k": cfg["num_experts_per_tok"],
        "layers": layers,
    }


def experts_read(b: int, experts: int, top_k: int) -> float:
    """The experts a layer reads on average for b tokens routed uniformly, top_k of experts each."""
    return experts * (1.0 - ((experts - top_k) / experts) ** b)


def decode_floor(pairs: list[tuple[int, int]], sizes: dict[str, float], copy_gbps: float) -> dict[str, float]:
    """The decode steps' bytes and seconds at the copy rate for requests (input, output) all
    admitted at once: the prefill gives each its first token, so decode step t (1 on) runs the
    requests of more than t output tokens, over t tokens of their own past the prompt."""
    steps = max(o for _, o in pairs)
    weight = kv = 0.0
    for t in range(1, steps):
        running = [(i, o) for i, o in pairs if o > t]
        touched = experts_read(len(running), int(sizes["experts"]), int(sizes["top_k"]))
        weight += sizes["layers"] * touched * sizes["expert"] + sizes["rest"]
        kv += sum(i + t for i, _ in running) * sizes["kv_token"]
    rate = copy_gbps * 1e9
    return {"steps": steps - 1, "weight_gb": weight / 1e9, "kv_gb": kv / 1e9, "decode_floor_s": (weight + kv) / rate}


def bound(shape: str, requests: int, copy_gbps: float, prefill_s: float, peer_req_per_s: float) -> dict:
    pairs = sharegpt_shaped(requests)
    floor = decode_floor(pairs, shape_bytes(SHAPES[shape]), copy_gbps)
    best = requests / (floor["decode_floor_s"] + prefill_s)
    return {
        "shape": shape,
        "requests": requests,
        "output_tokens": sum(o for _, o in pairs),
        **floor,
        "prefill_s": prefill_s,
        "best_req_per_s": best,
        "ratio_ceiling": best / peer_req_per_s,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=[s for s, c in SHAPES.items() if "num_experts_per_tok" in c])
    ap.add_argument("--requests", type=int, required=True, help="the job's first N requests")
    ap.add_argument("--copy-gbps", type=float, required=True, help="the GPU's measured copy rate, GB/s")
    ap.add_argument("--prefill-s", type=float, required=True, help="the run's prefill (mixed) steps' seconds")
    ap.add_argument("--peer-req-per-s", type=float, required=True, help="the peer's requests/s in the same job")
    ap.add_argument("--engine-req-per-s", type=float, help="the engine's, to set beside the ceiling")
    a = ap.parse_args(argv)
    out = bound(a.shape, a.requests, a.copy_gbps, a.prefill_s, a.peer_req_per_s)
    if a.engine_req_per_s:
        engine = a.engine_req_per_s
        out |= {"engine_ratio": engine / a.peer_req_per_s, "engine_of_best": engine / out["best_req_per_s"]}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
