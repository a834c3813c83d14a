"""The attention backend interface: store this step's K and V, attend over the pool.

How each layer attends (LayerAttention: its scale, sliding window and logit soft cap) is the
backend's, set once from the model's config, so every caller, the model's forward, the pieces'
runner and the decode graphs, names only the layer. The KV pool keeps every token of a request
whatever its layers' windows: a window limits what attention reads, never what is stored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.memory.kv_cache import KVCache
from services.worker.models.layers.ops import RowNorm, scale_rows
from shared.model_config import ModelConfig

# the ops' rotary_(q, k, positions, cos_sin): rotates q and k in place
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass(frozen=True)
class LayerAttention:
    """How one layer attends."""

    scale: float  # what q . k is multiplied by
    window: int = 0  # a query at position p sees keys in (p - window, p]; 0: every earlier key
    softcap: float = 0.0  # scaled scores s become softcap * tanh(s / softcap) before the softmax; 0: none


def attention_layers(cfg: ModelConfig) -> list[LayerAttention]:
    """Each layer's attention as the model's config gives it."""
    windows = cfg.layer_windows or (0,) * cfg.num_layers
    return [LayerAttention(cfg.attention_scale, w, cfg.attn_logit_softcap) for w in windows]


class AttentionBackend(ABC):
    def __init__(
        self, cache: KVCache, num_heads: int, head_dim: int, layers: Sequence[LayerAttention] | None = None
    ) -> None:
        """layers: each layer's attention; None: causal over every earlier key, scaled by
        head_dim^-1/2, no soft cap (the Llama family's)."""
        self.cache = cache
        self.num_heads = num_heads  # this rank's query heads
        self.head_dim = head_dim
        n = cache.layout.num_layers
        self.layers = tuple(layers) if layers is not None else (LayerAttention(head_dim**-0.5),) * n
        if len(self.layers) != n:
            raise ValueError(f"{len(self.layers)} layers' attention settings for a pool of {n} layers")

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """q: [T, Hq, D], k and v: [T, Hkv, D] for the packed new tokens -> [T, Hq, D].

        Stores k and v in the pool at batch.out_slots first, so each token attends to
        every earlier token of its request, itself included (causal)."""
        self.store(layer, k, v, batch.out_slots)
        return self.attend(layer, q, k, v, batch)

    def rotary_store(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        slots: torch.Tensor,
        rotary: Rotary,
    ) -> None:
        """Rotate q and k in place with rotary(q, k, positions, cos_sin) (the ops' rotary_), then
        store k and v at slots. A backend with a kernel doing both at once overrides this."""
        rotary(q, k, positions, cos_sin)
        self.store(layer, k, v, slots)

    def decode_attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
        cos_sin: torch.Tensor,
        rotary: Rotary,
        out: torch.Tensor | None = None,
        norm: RowNorm | None = None,
    ) -> torch.Tensor:
        """A decode-only batch (no extends), its q, k and v as projected: rotate q and k, store k
        and v at batch.out_slots, attend -> out [T, Hq, D]. A backend whose decode attention
        kernel does all three overrides this; q, k and v are left as stored here (rotated, and
        scaled by the norm), but need not be. norm: the layer's norm folded into the QKV weights
        (models/fold.py): q, k and v are first scaled by the inverse RMS of their row of its src."""
        if norm is not None:
            r = norm.inv_rms()
            for x in (q, k, v):
                x.copy_(scale_rows(x, r))
        self.rotary_store(layer, q, k, v, batch.positions, cos_sin, batch.out_slots, rotary)
        return self.attend(layer, q, k, v, batch, out)

    @abstractmethod
    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Write k and v [T, Hkv, D] into the pool at slots [T] (int32)."""

    @abstractmethod
    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of the batch's tokens, whose k and v are already stored -> out [T, Hq, D].
        q, k, v and out may hold more rows than the batch has tokens (padding): only the
        batch's own rows are read and written."""
