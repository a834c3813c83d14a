"""The fixed benchmark workload (../shared/bench/workload.py), found wherever it was put.

Every throughput figure uses the same (input_len, output_len) pairs; prompts are random
token ids drawn from a seeded generator, as the Hugging Face peer draws them.
"""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANDIDATES = (
    os.path.join(ROOT, ".peer", "workload.py"),  # copied there to travel to the GPU machine
    os.path.join(ROOT, "..", "shared", "bench", "workload.py"),
)


def sharegpt_shaped(n: int, path: str = "") -> list[tuple[int, int]]:
    """n (input_len, output_len) pairs of the fixed ShareGPT-shaped workload, seed 0."""
    for candidate in [path] if path else CANDIDATES:
        if os.path.exists(candidate):
            spec = importlib.util.spec_from_file_location("lightstream_workload", candidate)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module.sharegpt_shaped(n, seed=0)
    raise FileNotFoundError(f"workload.py not found (looked at {path or ', '.join(CANDIDATES)})")


def random_prompts(lengths: list[int], vocab: int, seed: int = 1) -> list[list[int]]:
    """Token ids drawn uniformly from [min(1000, vocab // 4), min(100000, vocab)), like the peer's prompts."""
    import random

    rng = random.Random(seed)
    low, high = min(1000, vocab // 4), min(100_000, vocab)
    return [[rng.randrange(low, high) for _ in range(n)] for n in lengths]
