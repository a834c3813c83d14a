"""Does reading the o projection's weights into L2 while a decode step's attention runs make
the projection faster? (services/worker/kernels/l2_warm.py)

Each variant is 32 layers of the Llama-3-8B projections (qkv, o, gate_up, down, each layer
its own weights so nothing stays in L2 by accident) with a sleep kernel standing for the
latency-bound kernels between qkv and o, captured in one CUDA graph and timed over its
replays. Prints one JSON object: ms per graph replay for each variant.

    python3 tools/diag/l2_warm_bench.py [--sleep-cycles 20000] [--batches 1,64]
"""

from __future__ import annotations

import argparse
import json

import torch

from services.worker.kernels.l2_warm import fold_size, l2_warm, warm_words

H, QKV, INTER, LAYERS = 4096, 6144, 14336, 32


def timed(fn, reps: int = 20) -> float:
    graph = torch.cuda.CUDAGraph()
    fn()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sleep-cycles", type=int, default=30000)
    ap.add_argument("--batches", default="1,64")
    args = ap.parse_args()
    dev = torch.device("cuda")
    bf = torch.bfloat16
    w = {
        "qkv": [torch.randn(QKV, H, dtype=bf, device=dev) for _ in range(LAYERS)],
        "o": [torch.randn(H, H, dtype=bf, device=dev) for _ in range(LAYERS)],
        "gate_up": [torch.randn(2 * INTER, H, dtype=bf, device=dev) for _ in range(LAYERS)],
        "down": [torch.randn(H, INTER, dtype=bf, device=dev) for _ in range(LAYERS)],
    }
    o_words = [warm_words(t) for t in w["o"]]
    half = [x[: x.numel() // 2] for x in o_words]
    gu_head = [warm_words(t)[: 4 * 2**20] for t in w["gate_up"]]  # its first 16 MiB
    side = torch.cuda.Stream()
    fold = torch.zeros(fold_size(o_words[0]), dtype=torch.int32, device=dev)
    warm = {"o": o_words, "o_half": half, "gu_head": gu_head}
    out: dict[str, float] = {}
    cyc = args.sleep_cycles
    out["sleep_only"] = timed(lambda: [torch.cuda._sleep(cyc) for _ in range(LAYERS)])
    out["warm_o_only"] = timed(lambda: [l2_warm(o_words[i], fold) for i in range(LAYERS)])
    for bs in (int(b) for b in args.batches.split(",")):
        x = torch.randn(bs, H, dtype=bf, device=dev)
        xi = torch.randn(bs, INTER, dtype=bf, device=dev)
        bufs = {n: torch.empty(bs, w[n][0].shape[0], dtype=bf, device=dev) for n in w}

        def o_alone(warm: bool, x=x, bufs=bufs) -> None:
            for i in range(LAYERS):
                if warm:
                    l2_warm(o_words[i], fold)
                torch.mm(x, w["o"][i].t(), out=bufs["o"])

        def layers(sleep: bool, what: str, join: str, x=x, xi=xi, bufs=bufs) -> None:
            main_s = torch.cuda.current_stream()
            for i in range(LAYERS):
                torch.mm(x, w["qkv"][i].t(), out=bufs["qkv"])
                if what:
                    side.wait_stream(main_s)
                    with torch.cuda.stream(side):
                        for name in what.split("+"):
                            words = warm[name][i]
                            l2_warm(words, fold[: fold_size(words)])
                if sleep:
                    torch.cuda._sleep(cyc)
                if what and join == "before_o":
                    main_s.wait_stream(side)
                torch.mm(x, w["o"][i].t(), out=bufs["o"])
                torch.mm(x, w["gate_up"][i].t(), out=bufs["gate_up"])
                if what and join == "after_gate_up":
                    main_s.wait_stream(side)
                torch.mm(xi, w["down"][i].t(), out=bufs["down"])

        out[f"b{bs}_o_alone"] = timed(lambda: o_alone(False))
        out[f"b{bs}_warm_then_o"] = timed(lambda: o_alone(True))
        out[f"b{bs}_gemms"] = timed(lambda: layers(False, "", ""))
        out[f"b{bs}_gemms_sleep"] = timed(lambda: layers(True, "", ""))
        for what in ("o", "o_half", "o+gu_head"):
            for join in ("before_o", "after_gate_up"):
                key = f"b{bs}_gemms_sleep_warm_{what}_join_{join}"
                out[key] = timed(lambda what=what, join=join: layers(True, what, join))
        out[f"b{bs}_gemms_warm_o_no_sleep"] = timed(lambda: layers(False, "o", "before_o"))
    print(json.dumps({k: round(v, 4) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
