"""Where a lone prompt's steps spend their host time on the GPU, and whether anything in them
waits for the device (torch.cuda.set_sync_debug_mode): docs/benchmarks.md r26.

    python tools/diag/prefill_steps.py

Builds the Llama-3-8B-shaped random engine as tools/benchmark_engine.py does, runs the
worker's warm-up, then the workload's first 12 prompts one at a time (3 tokens each); prints,
per prompt, the first three steps' wall time and the time in each phase of the step, then
the call stacks of any synchronising call (from the third prompt on).
"""

import collections
import json
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.getcwd())
import torch

from services.worker import engine as eng_mod
from services.worker.warmup import warm_up
from shared.messages import GenerateReq, SamplingParams
from tools import benchmark_engine as be
from tools.workload import random_prompts, sharegpt_shaped

args = be.parse_args(["--out", "/dev/null"])
engine, cfg, stop = be.make_engine(args)
warm_up(engine, cfg.vocab_size)
T = collections.defaultdict(float)


def timed(obj, name, label):
    f = getattr(obj, name)

    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            T[label] += time.perf_counter() - t

    setattr(obj, name, g)


timed(eng_mod, "build_batch", "build_batch")
timed(engine.sampler, "batch", "sampler.batch")
timed(engine.sampler, "sample", "sampler.sample")
timed(engine.runner, "forward", "forward")
timed(engine, "_copy_to_host", "copy_to_host")
timed(engine.scheduler, "schedule", "schedule")
timed(engine.scheduler, "launched", "scheduler.launched")
timed(engine, "_collect", "collect")
syncs = collections.Counter()


def show(message, category, filename, lineno, file=None, line=None):
    st = "".join(traceback.format_stack(limit=12)[:-2])
    syncs[st] += 1


warnings.showwarning = show
pairs = sharegpt_shaped(12, "")
prompts = random_prompts([i for i, _ in pairs], cfg.vocab_size, seed=1)
rows = []
for k, ids in enumerate(prompts):
    engine.add(GenerateReq(f"p{k}", "f", "d", ids, SamplingParams(max_new_tokens=3, ignore_eos=True), 0.0, 0.0))
    torch.cuda.synchronize()
    if k >= 2:
        torch.cuda.set_sync_debug_mode(1)
    steps = []
    while engine.has_work():
        T.clear()
        t = time.perf_counter()
        out = engine.step()
        dt = time.perf_counter() - t
        steps.append(
            {
                "ms": round(1e3 * dt, 3),
                "tokens": sum(len(i.token_ids) for _, i in out.items),
                **{k2: round(1e3 * v, 3) for k2, v in T.items()},
            }
        )
    torch.cuda.set_sync_debug_mode(0)
    rows.append({"len": len(ids), "steps": steps[:3]})
    print(json.dumps(rows[-1]), flush=True)
print("sync points:", sum(syncs.values()))
for st, n in syncs.most_common(8):
    print("----", n)
    print(st)
