"""The Qwen3 family (dense) over the token KV pool: Llama's math (llama.py) with an RMSNorm on
each head of q and of k after the QKV projection and before rotary, head_dim as config.json
gives it, and no QKV bias unless config.json asks for one.

The head norms live in ``_qkv``, which every path that computes q and k goes through: the plain
forward and its pieces (rotary and the KV store after them), and a decode-only step, whose
attention backend rotates and stores inside decode_attend.

The norms do not fold (``folds_norms`` False). A folded decode step projects the residual
itself and leaves the input norm's factor r = rsqrt(mean(x^2) + eps) to decode attention, which
scales q, k and v by r before rotary. Qwen3's head norm must come between that factor and
rotary: normed after it, q and k would be scaled by r once more; normed before it, the head
norm's eps meets q / r instead of q. Neither is the unfolded layer's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models import llama
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.random_weights import dense_random_weights
from services.worker.models.weights import LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


@dataclass
class Qwen3LayerWeights(LayerWeights):
    q_norm: torch.Tensor  # [D], one weight every q head shares (every rank holds it whole)
    k_norm: torch.Tensor  # [D]

    @classmethod
    def of(cls, layer: LayerWeights, q_norm: torch.Tensor, k_norm: torch.Tensor) -> Qwen3LayerWeights:
        """A layer's weights (no copy) with the head norms added."""
        return cls(**{f.name: getattr(layer, f.name) for f in fields(LayerWeights)}, q_norm=q_norm, k_norm=k_norm)


class Qwen3Model(llama.LlamaModel):
    folds_norms = False  # the head norms sit between the input norm's factor and rotary (above)

    def fold_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return []

    def decode_folded(self, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError("Qwen3's norms do not fold: its decode steps run forward")

    def _qkv(
        self, layer: LayerWeights, x: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Llama's QKV projection, then q and k each RMS-normed over head_dim with its layer's
        weight, written back in place: q, k and v stay views of the projection's output (the
        piecewise graphs' static buffer)."""
        assert isinstance(layer, Qwen3LayerWeights)
        q, k, v = super()._qkv(layer, x, out)
        self.ops.head_rmsnorm_(q, k, layer.q_norm, layer.k_norm, self.cfg.rms_norm_eps)  # [T, heads, D] each
        return q, k, v


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """Llama's tensors, and each layer's self_attn.q_norm and k_norm (replicated: every rank's
    heads share them)."""
    return with_head_norms(ckpt, llama.load(ckpt, cfg, shard))


def with_head_norms(ckpt: Checkpoint, w: ModelWeights) -> ModelWeights:
    """w's layers with the checkpoint's self_attn.q_norm and k_norm added."""

    def norm(i: int, n: str) -> torch.Tensor:
        return ckpt.put(ckpt.get(f"model.layers.{i}.self_attn.{n}_norm.weight"))

    w.layers = [Qwen3LayerWeights.of(layer, norm(i, "q"), norm(i, "k")) for i, layer in enumerate(w.layers)]
    return w


def random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """Dense random weights (random_weights.py) with head norms."""
    return with_random_head_norms(dense_random_weights(cfg, dtype, device, seed, tp), cfg, seed)


def with_random_head_norms(w: ModelWeights, cfg: ModelConfig, seed: int) -> ModelWeights:
    """w's layers with head norms near one added, drawn from a seed that is the same on every
    rank, as every rank holds them whole."""
    dtype, device = w.embed.dtype, w.embed.device
    g = torch.Generator(device=device).manual_seed(seed + 1)

    def norm() -> torch.Tensor:
        return (1.0 + 0.05 * torch.randn(cfg.head_dim, generator=g, device=device)).to(dtype)

    w.layers = [Qwen3LayerWeights.of(layer, norm(), norm()) for layer in w.layers]
    return w
