"""Each layer's RMSNorm weights folded into the projection that reads the norm's output, and the
forward a step then runs.

rmsnorm(x) @ W.t() is (x * r * g) @ W.t() with r = rsqrt(mean(x^2) + eps) per row and g the
norm's weight over W's input dim, which is r * (x @ (W * g).t()). With g folded into the QKV
and gate|up weights, a decode step needs no norm kernel: the products read the residual
stream itself, the kernels after them (decode attention, silu_mul) scale their rows by r,
which they compute from the residual (ops.RowNorm), and the o and down products add into the
residual in place (a GEMM with beta 1) instead of a kernel adding them. That is two kernels a
layer fewer (the model's decode_folded). The other steps keep their norm kernels, with weights
of ones, which leave a row as the unfolded norm would before its weight.

Whether a family can fold is its declared capability (``folds_norms``, ``fold_pairs``); the
transformation and the choice of forward live here, outside the model.
"""

from __future__ import annotations

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.interface import CausalLM

# the most requests a decode step runs decode_folded for. Its kernels each compute their rows'
# inverse RMS from the residual, once a program: decode attention's (request, KV head, split) and
# silu_mul's (row, 1024 columns). On an H200 at the 8B shape that saved 0.06-0.15 ms a step at
# batches 1-64, and cost 0.6 ms at 257-512 requests and 2.5 ms past 1024; larger steps keep their
# norm kernels (with the folded weights' unit norms).
FOLDED_MAX_BATCH = 64
# the projections a folded decode step adds into their output (the residual)
FOLDED_ACCUMULATE = frozenset({"o", "down"})


@torch.no_grad()
def fold_norms_(model: CausalLM) -> bool:
    """Fold each norm the model declares foldable into the product that reads it, in place (no
    second copy of the weights is ever held: an 8B model's would take 9 GiB from the KV pool);
    the norms' own weights become ones. Each product is computed in float32 and rounded once to
    the weights' dtype, as PyTorch's in-place multiply does. -> whether the model is now folded."""
    pairs = model.fold_pairs() if model.folds_norms else []
    if not pairs or not all(isinstance(w, torch.Tensor) for _, w in pairs):  # int4, fp8 weights: a norm does not fold
        return False
    for norm, weight in pairs:
        weight.mul_(norm[None, :])
        norm.fill_(1.0)
    return True


class StepForward:
    """The forward one step runs: the model's decode_folded for a decode-only step of up to
    FOLDED_MAX_BATCH requests when its norms are folded, else its forward."""

    def __init__(self, model: CausalLM, folded: bool) -> None:
        self.model = model
        self.folded = folded

    def runs_folded(self, decode_batch: int) -> bool:
        """Whether a decode-only step of decode_batch requests runs decode_folded."""
        return self.folded and decode_batch <= FOLDED_MAX_BATCH

    def accumulating(self, decode_batch: int) -> frozenset[str]:
        """The projections that a decode step of decode_batch requests adds into their output."""
        return FOLDED_ACCUMULATE if self.runs_folded(decode_batch) else frozenset()

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.num_extends == 0 and self.runs_folded(batch.num_tokens):
            with torch.inference_mode():
                return self.model.decode_folded(batch)
        return self.model.forward(batch)
