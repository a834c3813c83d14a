"""The Gemma 2 family over the token KV pool, and the layer Gemma 3 (gemma3.py) extends: Llama's
projections (llama.py) in Gemma's layer.

What differs from Llama, and where it lives:

- four norms a layer, each Gemma's RMSNorm, which multiplies the float32 normalised row by
  1 + weight and rounds once (the ops' unit_offset): the input norm (``attn_norm``), one on the
  attention's output before it joins the residual (``post_attn_norm``), the MLP's input norm
  (``mlp_norm``, the checkpoint's pre_feedforward_layernorm) and one on the MLP's output
  (``post_mlp_norm``); the final norm is Gemma's too;
- the embedding times sqrt(hidden_size), rounded to the weights' dtype first, as Hugging Face's
  scaled embedding multiplies by it;
- the MLP's activation: GELU's tanh approximation (the ops' gelu_tanh_mul) for SiLU;
- the attention, the backend's per-layer settings (attention/base.py, from shared/model_config.py):
  scale query_pre_attn_scalar^-1/2, a sliding window on the even layers, scores soft-capped
  (c * tanh(s / c), attn_logit_softcapping) before the softmax;
- the logits soft-capped the same way (final_logit_softcapping), in the weights' dtype as
  Hugging Face does.

The norms do not fold (``folds_norms`` False): folding moves a norm's weight into the product
after it, but the post-attention and post-MLP norms come after their products, and 1 + w in
float32 with one rounding is not what a folded bf16 weight computes. Decode steps run ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models import llama
from services.worker.models.attention.base import AttentionBackend
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.layers.ops import LayerOps
from services.worker.models.layers.projection import Project, plain
from services.worker.models.random_weights import dense_random_weights
from services.worker.models.weights import Carry, LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


@dataclass
class GemmaLayerWeights(LayerWeights):
    """A dense layer whose attn_norm is Gemma's input norm and mlp_norm its pre-feedforward norm,
    with the two norms Gemma adds (every rank holds them whole)."""

    post_attn_norm: torch.Tensor  # [H], on the attention's output (after o, all-reduced)
    post_mlp_norm: torch.Tensor  # [H], on the MLP's output (after down, all-reduced)

    @classmethod
    def of(cls, layer: LayerWeights, **norms: torch.Tensor) -> GemmaLayerWeights:
        """A dense layer's weights (no copy) with Gemma's norms given by name (any of them)."""
        return cls(**{f.name: getattr(layer, f.name) for f in fields(layer)} | norms)


class Gemma2Model(llama.LlamaModel):
    folds_norms = False  # post-norms and (1 + w) norms (above)

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
        super().__init__(cfg, weights, ops, attn, cos_sin, tp, project)
        # sqrt(hidden_size) as the weights' dtype holds it: Hugging Face multiplies by that
        self.embed_scale = float(torch.tensor(self.cfg.hidden_size**0.5, dtype=self.dtype))

    def fold_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return []

    def decode_folded(self, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError("Gemma's norms do not fold: its decode steps run forward")

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
        """Llama's piece (llama.py) over Gemma's layer: layer i - 1's o projection, its
        post-attention norm, the residual add and pre-feedforward norm, the MLP and its
        post-MLP norm; then layer i's input norm, QKV projection, rotary and KV store."""
        eps = self.cfg.rms_norm_eps
        if i == 0:
            residual = self.tp.embed(input_ids, self.w.embed, self.w.vocab_start) * self.embed_scale  # [T, H]
            x = self.ops.rmsnorm(residual, self.w.layers[0].attn_norm, eps, unit_offset=True)
        else:
            assert o is not None and carry is not None
            layer, residual = self.w.layers[i - 1], carry.residual
            assert isinstance(layer, GemmaLayerWeights)
            a = self.tp.all_reduce(self.project("o", o.reshape(o.shape[0], self.q_size), layer.o))
            a = self.ops.rmsnorm(a, layer.post_attn_norm, eps, unit_offset=True)
            x = self.ops.add_rmsnorm(a, residual, layer.mlp_norm, eps, unit_offset=True)
            h = self.ops.rmsnorm(self._mlp(layer, x), layer.post_mlp_norm, eps, unit_offset=True)
            if i == self.num_layers:
                return Carry(residual, h=h)
            x = self.ops.add_rmsnorm(h, residual, self.w.layers[i].attn_norm, eps, unit_offset=True)
        q, k, v = self._qkv(self.w.layers[i], x, qkv_out)
        if store:
            self.attn.rotary_store(i, q, k, v, positions, self.cos_sin_of(i), out_slots, self.ops.rotary_)
        return Carry(residual, q=q, k=k, v=v)

    def logits(self, last: Carry, sample_index: torch.Tensor | None) -> torch.Tensor:
        """Llama's (llama.py), with Gemma's final norm."""
        h, residual = last.h, last.residual
        assert h is not None
        if sample_index is not None:  # gathers, so the in-place add touches copies
            h, residual = h[sample_index], residual[sample_index]
        x = self.ops.add_rmsnorm(h, residual, self.w.final_norm, self.cfg.rms_norm_eps, unit_offset=True)
        return self._lm_head(x)

    def _lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Llama's output layer, then the final soft cap c * tanh(logits / c) where config.json
        sets one, in the logits' dtype and Hugging Face's order."""
        logits = super()._lm_head(x)
        cap = self.cfg.final_logit_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        a = self.ops.gelu_tanh_mul(self.project("gate_up", x, layer.gate_up))  # [T, I]
        return self.tp.all_reduce(self.project("down", a, layer.down))


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """Llama's tensors (llama.load), with Gemma's four norms a layer. llama.load reads the
    checkpoint's post_attention_layernorm as the MLP's input norm, which in Gemma is the
    pre_feedforward_layernorm: there it is the attention output's own norm."""
    w = llama.load(ckpt, cfg, shard)

    def layer(i: int, dense: LayerWeights) -> GemmaLayerWeights:
        def norm(name: str) -> torch.Tensor:
            return ckpt.put(ckpt.get(f"model.layers.{i}.{name}.weight"))

        return GemmaLayerWeights.of(
            dense,
            mlp_norm=norm("pre_feedforward_layernorm"),
            post_attn_norm=dense.mlp_norm,
            post_mlp_norm=norm("post_feedforward_layernorm"),
        )

    w.layers = [layer(i, dense) for i, dense in enumerate(w.layers)]
    return w


def random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """Dense random weights (random_weights.py) with Gemma's norms: every norm's weight near zero
    (Gemma's norms scale by 1 + w), drawn from a seed that is the same on every rank, as every
    rank holds them whole."""
    w = dense_random_weights(cfg, dtype, device, seed, tp)
    g = torch.Generator(device=device).manual_seed(seed + 2)

    def norm() -> torch.Tensor:
        return (0.05 * torch.randn(cfg.hidden_size, generator=g, device=device)).to(dtype)

    names = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm")
    w.layers = [GemmaLayerWeights.of(layer, **{n: norm() for n in names}) for layer in w.layers]
    w.final_norm = norm()
    return w
