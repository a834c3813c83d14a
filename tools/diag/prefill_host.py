"""Where a lone prompt's prefill spends its host time, on the GPU: docs/benchmarks.md r30.

    python tools/diag/prefill_host.py

Builds the Llama-3-8B-shaped random engine as tools/benchmark_engine.py does and runs its
warm-up, then prints: the host time of the model's forward for a prompt's prefill, the first
and second time at each of several lengths; a cProfile and a torch.profiler table (CPU) of one
prefill at a length not seen before; and the host time of one cuBLAS (then cuBLASLt) matmul
launch at a new row count, three times in a row.
"""

import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.getcwd())
import torch
from torch.profiler import ProfilerActivity, profile

from services.worker.warmup import warm_up
from shared.messages import GenerateReq, SamplingParams
from tools import benchmark_engine as be
from tools.workload import random_prompts

args = be.parse_args(["--out", "/dev/null"])
engine, cfg, stop = be.make_engine(args)
warm_up(engine, cfg.vocab_size)
forward = engine.runner.forward
times: list[tuple[float, int]] = []  # (host seconds, extends) of each forward
profiler: dict[str, cProfile.Profile] = {}


def timed(batch):
    torch.cuda.synchronize()
    p = profiler.get("p")
    t = time.perf_counter()
    if p is not None and batch.num_extends:
        p.enable()
        out = forward(batch)
        p.disable()
    else:
        out = forward(batch)
    times.append((time.perf_counter() - t, batch.num_extends))
    return out


engine.runner.forward = timed
count = [0]


def prefill_ms(length: int) -> float:
    count[0] += 1
    ids = random_prompts([length], cfg.vocab_size, seed=count[0])[0]
    params = SamplingParams(max_new_tokens=2, ignore_eos=True)
    engine.add(GenerateReq(f"r{count[0]}", "f", "d", ids, params, 0.0, 0.0))
    times.clear()
    while engine.has_work():
        engine.step()
    torch.cuda.synchronize()
    return round(1e3 * next(t for t, e in times if e), 2)


print("forward host ms, first and second time at a length:")
for length in [202, 203, 250, 333, 16, 885, 64, 128, 129, 500]:
    print(length, prefill_ms(length), prefill_ms(length), flush=True)
profiler["p"] = cProfile.Profile()
prefill_ms(217)
s = io.StringIO()
pstats.Stats(profiler.pop("p"), stream=s).sort_stats("tottime").print_stats(25)
print(s.getvalue()[:6000])
with profile(activities=[ProfilerActivity.CPU]) as prof:
    prefill_ms(219)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
w = engine.runner.model.w.layers[0].gate_up
print("matmul launch host us at a new row count, three times (x @ w.t(), gate_up):")
for lib in ("cublas", "cublaslt"):
    torch.backends.cuda.preferred_blas_library(lib)
    for m in (211, 311, 411, 611, 1111, 64, 1):
        x = torch.randn(m, w.shape[1], device="cuda", dtype=w.dtype)
        us = []
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            x @ w.t()
            us.append(round(1e6 * (time.perf_counter() - t), 1))
        print(lib, m, us, flush=True)
torch.backends.cuda.preferred_blas_library("cublas")
