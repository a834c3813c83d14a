"""Runs the Hugging Face peer (../shared/bench/peer_hf.py, unchanged) with room left for its
continuous-batching thread: usage `python tools/peer_capped.py PEER_HF.PY [--cache-memory F] ARGS...`.

On Mistral-7B, Phi-3-mini and Mixtral-8x7B shapes the peer's background thread dies at its first
step with CUBLAS_STATUS_INTERNAL_ERROR from cublasCreate: transformers sizes the paged cache at
90 % of the free memory, and the new thread's cuBLAS handle then finds none. Two remedies, both
outside the peer's code: a cuBLAS handle made first on a short-lived thread (PyTorch returns a
finished thread's handle to its pool, so the batching thread takes it instead of creating one),
and the cache capped at --cache-memory of the free memory where transformers has the hook for it."""

from __future__ import annotations

import os
import runpy
import sys
import threading


def pool_a_cublas_handle() -> None:
    """One bf16 matmul on a thread that then ends: its cuBLAS handle stays in PyTorch's pool."""
    import torch

    def work() -> None:
        a = torch.ones(64, 64, device="cuda", dtype=torch.bfloat16)
        (a @ a).sum().item()

    t = threading.Thread(target=work)
    t.start()
    t.join()


def cap_cache_memory(fraction: float) -> bool:
    """Sets transformers' continuous-batching max_memory_percent to fraction where the config
    leaves it unset; False where this transformers has no such hook."""
    try:
        from transformers.generation.continuous_batching import initialization
    except ImportError:
        return False
    resolve = getattr(initialization, "resolve_max_memory_percent", None)
    if resolve is None:
        return False

    def capped(cb_config, *args, **kwargs):
        if cb_config.max_memory_percent is None:
            cb_config.max_memory_percent = fraction
        return resolve(cb_config, *args, **kwargs)

    initialization.resolve_max_memory_percent = capped
    return True


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__.split("\n\n")[0])
    peer, rest = argv[0], argv[1:]
    fraction = 0.8
    if "--cache-memory" in rest:
        k = rest.index("--cache-memory")
        fraction = float(rest[k + 1])
        del rest[k : k + 2]
    pool_a_cublas_handle()
    hooked = cap_cache_memory(fraction)
    print(f"peer_capped: cache at {fraction} of free memory" if hooked else "peer_capped: no cache hook", flush=True)
    sys.argv = [peer, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(peer)))  # the peer's own imports (workload.py)
    runpy.run_path(peer, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
