"""The Llama family (Llama 2 and 3, Mistral, Qwen2) over the token KV pool.

One forward runs a packed batch (see forward_batch.py) through every layer and returns
the logits of the positions to sample. The math follows Hugging Face's modeling code;
the steps that differ between the CPU and CUDA paths are the ops strategy and the
attention backend, passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.attention.base import AttentionBackend
from services.worker.blas_choice import prefer
from services.worker.forward_batch import ForwardBatch
from services.worker.ops import LayerOps
from services.worker.parallel import TensorParallel
from shared.model_config import ModelConfig


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 * Hkv) * D, H], this rank's heads
    qkv_bias: torch.Tensor | None  # [(Hq + 2 * Hkv) * D]
    o: torch.Tensor  # [H, Hq * D]
    mlp_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H], this rank's share of the intermediate size
    down: torch.Tensor  # [H, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V / tp, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V / tp, H]; the embedding itself when tied
    vocab_start: int = 0  # first token id of this rank's vocabulary shard


class LlamaModel:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        ops: LayerOps,
        attn: AttentionBackend,
        cos_sin: torch.Tensor,
        tp: TensorParallel,
    ) -> None:
        self.cfg = cfg
        self.w = weights
        self.ops = ops
        self.attn = attn
        self.cos_sin = cos_sin  # [max_pos, D] float32
        self.tp = tp
        self.q_heads = cfg.num_heads // tp.size
        self.kv_heads = cfg.num_kv_heads // tp.size
        self.head_dim = cfg.head_dim
        self.q_size = self.q_heads * cfg.head_dim
        self.kv_size = self.kv_heads * cfg.head_dim
        # projection name -> BLAS library, set while a decode graph is captured (blas_choice.py)
        self.blas: dict[str, str] | None = None

    def projections(self) -> dict[str, list[torch.Tensor]]:
        """Each projection's weights [N, K], one per layer (the LM head's once)."""
        names = ("qkv", "o", "gate_up", "down")
        out = {n: [getattr(layer, n) for layer in self.w.layers] for n in names}
        return out | {"lm_head": [self.w.lm_head]}

    def _proj(self, name: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.blas is None:
            return x @ w.t()
        with prefer(self.blas[name]):
            return x @ w.t()

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> float32 logits [S, V] for batch.sample_index."""
        eps = self.cfg.rms_norm_eps
        h = self.tp.embed(batch.input_ids, self.w.embed, self.w.vocab_start)  # [T, H]
        residual = h
        x = self.ops.rmsnorm(h, self.w.layers[0].attn_norm, eps)
        for i, layer in enumerate(self.w.layers):
            if i > 0:
                x = self.ops.add_rmsnorm(h, residual, layer.attn_norm, eps)
            h = self._attention(i, layer, x, batch)
            x = self.ops.add_rmsnorm(h, residual, layer.mlp_norm, eps)
            h = self._mlp(layer, x)
        idx = batch.sample_index
        last = self.ops.add_rmsnorm(h[idx], residual[idx].clone(), self.w.final_norm, eps)  # [S, H]
        logits = self.tp.gather_vocab(self._proj("lm_head", last, self.w.lm_head))
        return logits[:, : self.cfg.vocab_size].float()

    def _attention(self, i: int, layer: LayerWeights, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        t = x.shape[0]
        qkv = self._proj("qkv", x, layer.qkv)  # [T, (Hq + 2 Hkv) D]
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        q = qkv[:, : self.q_size].view(t, self.q_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.kv_heads, self.head_dim)
        self.ops.rotary_(q, k, batch.positions, self.cos_sin)
        o = self.attn.forward(i, q, k, v, batch)  # [T, Hq, D]
        return self.tp.all_reduce(self._proj("o", o.reshape(t, self.q_size), layer.o))

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        a = self.ops.silu_mul(self._proj("gate_up", x, layer.gate_up))  # [T, I]
        return self.tp.all_reduce(self._proj("down", a, layer.down))
