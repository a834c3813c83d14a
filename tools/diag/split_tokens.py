"""Decode attention's split length against the decode step at small batches and the first 300
requests offline (the Hugging Face peer's side by side), on the GPU: docs/benchmarks.md r33.

    python tools/diag/split_tokens.py SPLIT_TOKENS COPY_GBPS

One value per process (the decode graphs bake it in when they are captured). COPY_GBPS is the
copy bandwidth for the static rows' bandwidth floor (benchmark_engine's ceilings).
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())
from services.worker.attention import triton_backend

triton_backend.SPLIT_TOKENS = int(sys.argv[1])

from services.worker.warmup import warm_up  # noqa: E402
from tools import benchmark_engine as be  # noqa: E402

args = be.parse_args(["--out", "/dev/null"])
engine, cfg, stop = be.make_engine(args)
warm_up(engine, cfg.vocab_size)
bw = float(sys.argv[2]) * 1e9
rows = []
for b, c in [(1, 1024), (1, 2048), (4, 1024), (8, 1024), (16, 1024), (32, 1024), (64, 1024)]:
    rows.append((b, c, round(be.static_decode(engine, cfg, b, c, 64, bw)["ms_per_step"], 3)))
side = be.offline(engine, cfg, 300, "")
prof = side["profile"]
out = {"split_tokens": triton_backend.SPLIT_TOKENS, "static": rows, "offline300_req_per_s": round(side["req_per_s"], 3),
       "bs_1_8_ms": prof.get("decode_bs_1_8"), "bs_9_64_ms": prof.get("decode_bs_9_64")}  # fmt: skip
print(json.dumps(out), flush=True)
