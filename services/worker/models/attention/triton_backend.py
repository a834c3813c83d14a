"""Attention on Triton kernels: the CUDA path.

A step with prompt tokens rotates its q and k and stores its new K/V in the pool (one kernel,
rotary_store.py; an int8 or e4m3 pool's store is its own kernel), runs extend attention over the
packed extend segments (prefix read from the pool, new tokens from this step's k/v) and
split-K decode attention over the decoding requests, each into its slice of one output
tensor. A decode-only step over a float pool (decode_attend) leaves the rotary and the store
to the decode attention kernel itself.

CUDA graphs: the decode path reads no device value on the host and allocates nothing once
the split scratch has reached its largest size (give ``max_decode_batch`` to size it up
front, or run the largest batch once before capture). The grid's ``num_splits`` is picked on
the host from ``batch.decode_max_len``, so a captured graph must be replayed only for batches
that pick the same split count (capture with a fixed context bound, see ``choose_num_splits``);
inside the grid each request uses as many splits as its own context warrants (SPLIT_TOKENS).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.kernels.decode_attention import (
    SPLIT_TOKENS,
    NewTokens,
    choose_num_splits,
    decode_attention,
    split_min_tokens,
)
from services.worker.kernels.extend_attention import extend_attention
from services.worker.kernels.kv_store import store_kv
from services.worker.kernels.kv_store_quant import store_kv_quantized
from services.worker.kernels.rotary_store import rotary_store_
from services.worker.memory.kv_cache import KVCache
from services.worker.models.attention.base import AttentionBackend, LayerAttention, Rotary
from services.worker.models.layers.ops import RowNorm

# up to this many splits a request, the last split to finish combines them; with more, the
# reduce kernel does (one job on an H200, 8B shape, context 1024: a decode step took 5.06 /
# 5.31 ms with the last split combining at batch 8 / 16, 5 and 3 splits, against 5.08 / 5.39 with
# the reduce; and 4.78 against 4.74 at batch 1, whose 16 splits one program then goes through
# one by one)
FUSE_MAX_SPLITS = 8


class TritonAttention(AttentionBackend):
    def __init__(
        self,
        cache: KVCache,
        num_heads: int,
        head_dim: int,
        max_decode_batch: int = 0,
        layers: Sequence[LayerAttention] | None = None,
    ) -> None:
        super().__init__(cache, num_heads, head_dim, layers)
        device = cache.k[0].device
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.split_min = split_min_tokens(head_dim, cache.layout.dtype, device.type == "cuda")
        # split-K scratch, flat so any (batch, splits) views it; grows, never shrinks
        self._mid_o = torch.empty(0, dtype=torch.float32, device=device)
        self._mid_lse = torch.empty(0, dtype=torch.float32, device=device)
        # per (request, KV head): how many splits have finished; the last one combines them
        # (decode_attention, fused) and leaves it zero again
        self._counts = torch.zeros(0, dtype=torch.int32, device=device)
        if max_decode_batch > 0:
            worst = max(b * self._num_splits(b, 1 << 30) for b in range(1, max_decode_batch + 1))
            self._reserve(worst, max_decode_batch)

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
        """One kernel rotates q and k and stores k and v (the same arithmetic as the rotary
        kernel, TritonOps.rotary_); an int8 or e4m3 pool keeps the two, its store computing the scales."""
        if self.cache.layout.quantized:
            super().rotary_store(layer, q, k, v, positions, cos_sin, slots, rotary)
            return
        rotary_store_(q, k, v, positions, cos_sin, self.cache.k[layer], self.cache.v[layer], slots)

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        cache = self.cache
        if cache.layout.quantized:
            assert cache.k_scale is not None and cache.v_scale is not None
            store_kv_quantized(k, v, cache.k[layer], cache.v[layer], cache.k_scale[layer], cache.v_scale[layer], slots)
        else:
            store_kv(k, v, cache.k[layer], cache.v[layer], slots)

    def attend(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: ForwardBatch,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if out is None:
            out = torch.empty_like(q)  # [T, Hq, D]
        e = batch.num_extend_tokens
        if batch.num_extends > 0:
            k_scale, v_scale = self._scales(layer)
            how = self.layers[layer]
            extend_attention(
                q[:e],
                k[:e],
                v[:e],
                self.cache.k[layer],
                self.cache.v[layer],
                batch.req_table,
                batch.extend_rows,
                batch.extend_starts,
                batch.extend_lens,
                batch.extend_prefix_lens,
                batch.extend_max_len,
                how.scale,
                out=out[:e],
                k_scale=k_scale,
                v_scale=v_scale,
                window=how.window,
                softcap=how.softcap,
            )
        if batch.num_decodes > 0:
            self._decode(layer, q[e : e + batch.num_decodes], batch, out[e : e + batch.num_decodes])
        return out

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
        """The decode attention kernel rotates q and k and stores k and v itself (float pools; an
        int8 or e4m3 pool's store computes scales first, so it keeps rotary_store), and applies a folded
        norm's factor: one kernel a layer fewer, or three with a folded norm. q, k and v are read,
        not changed in place."""
        if self.cache.layout.quantized or batch.num_extends > 0:
            return super().decode_attend(layer, q, k, v, batch, cos_sin, rotary, out, norm)
        if out is None:
            out = torch.empty_like(q)
        bd = batch.num_decodes
        if bd > 0:
            rows_norm = RowNorm(norm.src[:bd], norm.eps) if norm is not None else None
            new = NewTokens(k[:bd], v[:bd], cos_sin, batch.out_slots[:bd], rows_norm)  # at positions seq_lens - 1
            self._decode(layer, q[:bd], batch, out[:bd], new)
        return out

    def _decode(
        self, layer: int, q: torch.Tensor, batch: ForwardBatch, out: torch.Tensor, new: NewTokens | None = None
    ) -> None:
        """Split-K decode attention of the batch's decoding requests (q, out: their rows)."""
        cache = self.cache
        k_scale, v_scale = self._scales(layer)
        bd = batch.num_decodes
        how = self.layers[layer]
        # a sliding window's splits divide the window: no more of them than it warrants
        splits = self._num_splits(bd, min(batch.decode_max_len, how.window or batch.decode_max_len))
        self._reserve(bd * splits, bd)
        hq, d = self.num_heads, self.head_dim
        mid_o = self._mid_o[: bd * hq * splits * d].view(bd, hq, splits, d)
        mid_lse = self._mid_lse[: bd * hq * splits].view(bd, hq, splits)
        decode_attention(
            q,
            cache.k[layer],
            cache.v[layer],
            batch.req_table,
            batch.decode_rows,
            batch.decode_seq_lens,
            how.scale,
            splits,
            out=out,
            split_tokens=SPLIT_TOKENS,
            k_scale=k_scale,
            v_scale=v_scale,
            mid_o=mid_o,
            mid_lse=mid_lse,
            counts=self._counts if splits <= FUSE_MAX_SPLITS else None,
            new=new,
            window=how.window,
            softcap=how.softcap,
        )

    def _scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """An int8 or e4m3 pool's (k, v) scales of the layer; (None, None) for a float pool."""
        cache = self.cache
        if not cache.layout.quantized:
            return None, None
        assert cache.k_scale is not None and cache.v_scale is not None
        return cache.k_scale[layer], cache.v_scale[layer]

    def _num_splits(self, batch: int, max_len: int) -> int:
        return choose_num_splits(batch, self.cache.layout.kv_heads, max_len, self.num_sms, self.split_min)

    def _reserve(self, batch_splits: int, batch: int) -> None:
        """Make the scratch hold batch_splits (request, split) pairs, and the counts batch requests."""
        need = batch_splits * self.num_heads
        device = self._mid_lse.device
        if self._mid_lse.numel() < need:
            self._mid_o = torch.empty(need * self.head_dim, dtype=torch.float32, device=device)
            self._mid_lse = torch.empty(need, dtype=torch.float32, device=device)
        if self._counts.numel() < batch * self.cache.layout.kv_heads:
            self._counts = torch.zeros(batch * self.cache.layout.kv_heads, dtype=torch.int32, device=device)
