"""Runs the Hugging Face peer (../shared/bench/peer_hf.py, unchanged) on a model whose vocabulary
is smaller than the peer's prompt ids: usage `python tools/peer_vocab.py PEER_HF.PY ARGS...`.

The peer draws its prompts' token ids from [1000, 100000). Mistral-7B, Phi-3-mini and Mixtral-8x7B
have about 32,000 tokens, so their embedding lookup reads past the table: on the GPU that is a
device-side fault which surfaces at the batching thread's next cuBLAS call
(CUBLAS_STATUS_INTERNAL_ERROR), and the thread dies at its first step. Here each prompt's ids are
taken modulo the model's vocabulary size before the request reaches transformers' continuous
batching: the lengths, and so the work, are the peer's own; with random weights the ids' values
change nothing of the speed."""

from __future__ import annotations

import os
import runpy
import sys


def vocab_size(model) -> int:
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


def fold(ids: list[int], vocab: int) -> list[int]:
    return [int(i) % vocab for i in ids]


def fold_prompts_into_vocab() -> bool:
    """Wraps ContinuousBatchingManager.add_request (which add_requests calls too) to fold prompt ids
    into the model's vocabulary; False where this transformers has no such class."""
    try:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
    except ImportError:
        return False
    add_request = ContinuousBatchingManager.add_request

    def folded_request(self, input_ids, *args, **kwargs):
        return add_request(self, fold(input_ids, vocab_size(self.model)), *args, **kwargs)

    ContinuousBatchingManager.add_request = folded_request
    return True


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__.split("\n\n")[0])
    peer, rest = argv[0], argv[1:]
    hooked = fold_prompts_into_vocab()
    print("peer_vocab: prompt ids folded into the vocabulary" if hooked else "peer_vocab: no hook", flush=True)
    sys.argv = [peer, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(peer)))  # the peer's own imports (workload.py)
    runpy.run_path(peer, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
