"""Attention in plain PyTorch: the CPU path and the reference for the Triton kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.worker.forward_batch import ForwardBatch
from services.worker.memory.kv_cache import quantize_kv
from services.worker.models.attention.base import AttentionBackend, LayerAttention


class TorchAttention(AttentionBackend):
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
            out = torch.empty_like(q)
        e = batch.num_extend_tokens
        for i in range(batch.num_extends):
            prefix = batch.extend_prefix_lens_host[i]
            n = batch.extend_lens_host[i]
            start = int(batch.extend_starts[i])
            table_row = batch.req_table[int(batch.extend_rows[i])]
            # the prefix comes from the pool, this step's tokens as computed (never re-read quantized)
            pk, pv = self.cache.dequantized(layer, table_row[:prefix].long())
            kk = torch.cat([pk, k[start : start + n].to(pk.dtype)])
            vv = torch.cat([pv, v[start : start + n].to(pv.dtype)])
            out[start : start + n] = self._attend(q[start : start + n], kk, vv, prefix, self.layers[layer])
        for j in range(batch.num_decodes):
            length = int(batch.decode_seq_lens[j])
            table_row = batch.req_table[int(batch.decode_rows[j])]
            kk, vv = self.cache.dequantized(layer, table_row[:length].long())
            out[e + j : e + j + 1] = self._attend(q[e + j : e + j + 1], kk, vv, length - 1, self.layers[layer])
        return out

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        idx = slots.long()
        cache = self.cache
        if cache.layout.quantized:
            assert cache.k_scale is not None and cache.v_scale is not None
            kq, ks = quantize_kv(k, cache.layout.quant_dtype)
            vq, vs = quantize_kv(v, cache.layout.quant_dtype)
            cache.k[layer][idx] = kq
            cache.v[layer][idx] = vq
            cache.k_scale[layer][idx] = ks
            cache.v_scale[layer][idx] = vs
        else:
            cache.k[layer][idx] = k.to(cache.k[layer].dtype)
            cache.v[layer][idx] = v.to(cache.v[layer].dtype)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first_pos: int, how: LayerAttention
    ) -> torch.Tensor:
        """q: [n, Hq, D] at positions first_pos.. over k, v: [length, Hkv, D] (causal, within the
        layer's window)."""
        length = k.shape[0]
        group = self.num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, length, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        qh = q.transpose(0, 1)  # [Hq, n, D]
        n = q.shape[0]
        q_pos = torch.arange(first_pos, first_pos + n, device=q.device)[:, None]
        k_pos = torch.arange(length, device=q.device)[None, :]
        mask = k_pos <= q_pos  # [n, length]
        if how.window > 0:
            mask &= k_pos > q_pos - how.window
        if how.softcap > 0:
            o = _softcapped_attention(qh, k, v, mask, how.scale, how.softcap)
        else:
            o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=how.scale)
        return o.transpose(0, 1)


def _softcapped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float
) -> torch.Tensor:
    """Hugging Face's eager attention with a logit soft cap (Gemma 2), in its order: scores in the
    activation dtype, scaled, capped (c * tanh(s / c)), masked, softmax in float32 rounded back,
    then times v. q: [Hq, n, D], k and v: [Hq, length, D], mask: [n, length] -> [Hq, n, D]."""
    scores = torch.matmul(q, k.transpose(1, 2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
