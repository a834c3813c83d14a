"""What the runtime may ask of a model: the interface every family's model class offers.

The runtime (CUDA graphs, piecewise graphs, norm folding, BLAS choice) wraps a model through
this and nothing else, so a family's file never knows how it is made fast, and the runtime
never knows which family it runs.
"""

from __future__ import annotations

from typing import Protocol

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.attention.base import AttentionBackend
from services.worker.models.layers.projection import Project
from services.worker.models.weights import Carry


class CausalLM(Protocol):
    attn: AttentionBackend
    project: Project  # what computes each named projection; the runtime may replace it
    num_layers: int
    dtype: torch.dtype
    q_heads: int  # this rank's
    head_dim: int
    qkv_size: int  # this rank's fused QKV projection's output width
    # the capability of folding each layer's norms into the products that read them (runtime/folding.py):
    # False where the family applies a norm that cannot move into a weight (e.g. Gemma's 1 + w)
    folds_norms: bool

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] for batch.sample_index."""
        ...

    def piece(
        self,
        i: int,
        o: torch.Tensor | None,
        carry: Carry | None,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_slots: torch.Tensor,
        qkv_out: torch.Tensor | None = None,
        store: bool = True,
    ) -> Carry:
        """The part of a forward between attention i - 1 and attention i (0..num_layers)."""
        ...

    def logits(self, last: Carry, sample_index: torch.Tensor | None) -> torch.Tensor:
        """The last piece's output -> logits [S, V]."""
        ...

    def projections(self) -> dict[str, list[torch.Tensor]]:
        """Each projection's weights [N, K] by name, one per layer (the LM head's once)."""
        ...

    def fold_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(norm weight [K], product weight [N, K]) for each norm that may be folded into the
        product reading its output; [] where folds_norms is False."""
        ...

    def decode_folded(self, batch: ForwardBatch) -> torch.Tensor:
        """A decode-only step with the norms folded into the weights -> logits [S, V]; the o and
        down products add into the residual (the projections named by FOLDED_ACCUMULATE)."""
        ...
