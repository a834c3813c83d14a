"""The attention backend interface: store this step's K and V, attend over the pool."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.memory.kv_cache import KVCache
from services.worker.models.layers.ops import RowNorm, scale_rows

# the ops' rotary_(q, k, positions, cos_sin): rotates q and k in place
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


class AttentionBackend(ABC):
    def __init__(self, cache: KVCache, num_heads: int, head_dim: int) -> None:
        self.cache = cache
        self.num_heads = num_heads  # this rank's query heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5

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
