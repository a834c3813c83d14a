"""The Gemma 3 family (text: Gemma3ForCausalLM, model type gemma3_text) over the token KV pool:
Gemma 2's layer (gemma2.py) with an RMSNorm on each head of q and of k, Gemma's (1 + w), after
the QKV projection and before rotary, as Qwen3 has Llama's (qwen3.py).

What else differs from Gemma 2 lives where it enters:

- two rotary tables: the sliding-window layers turn q and k by one of their own base
  (rope_local_base_freq, unscaled), the full-attention layers by rope_theta's with the config's
  scaling (linear, factor 8, in the larger models); ``cos_sin_of`` picks a layer's;
- the attention settings (shared/model_config.py): the window on five layers of six
  (sliding_window_pattern, or layer_types), no attention soft cap, the final one where set.

The head norms live in ``_qkv``, which every path that computes q and k goes through (the plain
forward, its pieces, and a decode-only step's, whose backend rotates and stores); q and k are
normed in place, so they stay views of the piecewise graphs' static QKV buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from services.worker.models import gemma2
from services.worker.models.attention.base import AttentionBackend
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.layers.ops import LayerOps
from services.worker.models.layers.projection import Project, plain
from services.worker.models.layers.rope import cos_sin_table
from services.worker.models.weights import LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


@dataclass
class Gemma3LayerWeights(gemma2.GemmaLayerWeights):
    q_norm: torch.Tensor  # [D], one weight every q head shares (every rank holds it whole)
    k_norm: torch.Tensor  # [D]

    @classmethod
    def with_head_norms(
        cls, layer: gemma2.GemmaLayerWeights, q_norm: torch.Tensor, k_norm: torch.Tensor
    ) -> Gemma3LayerWeights:
        """A Gemma layer's weights (no copy) with the head norms added."""
        own = {f.name: getattr(layer, f.name) for f in fields(gemma2.GemmaLayerWeights)}
        return cls(**own, q_norm=q_norm, k_norm=k_norm)


class Gemma3Model(gemma2.Gemma2Model):
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        ops: LayerOps,
        attn: AttentionBackend,
        cos_sin: torch.Tensor,
        tp: TensorParallel,
        project: Project = plain,
    ) -> None:
        """cos_sin: the full-attention layers' table (rope_theta, scaled); the sliding layers'
        is made here, of the same length, from local_rope_theta."""
        super().__init__(cfg, weights, ops, attn, cos_sin, tp, project)
        self.cos_sin_local = cos_sin_table(cfg.head_dim, cfg.local_rope_theta, {}, cos_sin.shape[0], cos_sin.device)
        self.sliding = [w > 0 for w in cfg.layer_windows or (0,) * cfg.num_layers]

    def cos_sin_of(self, layer: int) -> torch.Tensor:
        return self.cos_sin_local if self.sliding[layer] else self.cos_sin

    def _qkv(
        self, layer: LayerWeights, x: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Llama's QKV projection, then q and k each normed over head_dim by Gemma's RMSNorm
        with its layer's weight, written back in place (views of the projection's output)."""
        assert isinstance(layer, Gemma3LayerWeights)
        q, k, v = super()._qkv(layer, x, out)
        self.ops.head_rmsnorm_(q, k, layer.q_norm, layer.k_norm, self.cfg.rms_norm_eps, unit_offset=True)
        return q, k, v


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """Gemma 2's tensors (gemma2.load), and each layer's self_attn.q_norm and k_norm (replicated:
    every rank's heads share them)."""
    w = gemma2.load(ckpt, cfg, shard)

    def norm(i: int, n: str) -> torch.Tensor:
        return ckpt.put(ckpt.get(f"model.layers.{i}.self_attn.{n}_norm.weight"))

    w.layers = [_with_head_norms(layer, norm(i, "q"), norm(i, "k")) for i, layer in enumerate(w.layers)]
    return w


def random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """Gemma 2's random weights with head norms near zero (Gemma's norms scale by 1 + w), drawn
    from a seed that is the same on every rank, as every rank holds them whole."""
    w = gemma2.random_weights(cfg, dtype, device, seed, tp)
    g = torch.Generator(device=device).manual_seed(seed + 3)

    def norm() -> torch.Tensor:
        return (0.05 * torch.randn(cfg.head_dim, generator=g, device=device)).to(dtype)

    w.layers = [_with_head_norms(layer, norm(), norm()) for layer in w.layers]
    return w


def _with_head_norms(layer: LayerWeights, q_norm: torch.Tensor, k_norm: torch.Tensor) -> Gemma3LayerWeights:
    assert isinstance(layer, gemma2.GemmaLayerWeights)
    return Gemma3LayerWeights.with_head_norms(layer, q_norm, k_norm)
