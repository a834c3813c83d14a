"""The Qwen mixture-of-experts families over the token KV pool, which share their checkpoint's
names: Qwen2-MoE (Qwen2MoeForCausalLM: Qwen2's attention with its QKV bias, and a shared
expert beside the routed ones) and Qwen3-MoE (Qwen3MoeForCausalLM: Qwen3's attention, q and k
RMS-normed per head, and no shared expert). The MLP is moe.py's.

- The checkpoint (``load`` here): a sparse layer's router is mlp.gate.weight [E, H], expert
  e's projections mlp.experts.{e}.gate_proj, up_proj and down_proj; Qwen2-MoE's shared expert
  is mlp.shared_expert.gate_proj, up_proj and down_proj, and its gate
  mlp.shared_expert_gate.weight [1, H], which joins the router as its last row. A dense layer
  (mlp_only_layers, decoder_sparse_step) has Llama's mlp.gate_proj, up_proj and down_proj.
- The routing: the top-k weights are renormalised as norm_topk_prob says (false by default)
  and rounded to the model's dtype, as the Qwen routers do.
- Qwen3-MoE's head norms: ``Qwen3MoeModel`` takes the MLP from MoEModel and ``_qkv`` from
  Qwen3Model, whose head norms every path that computes q and k goes through.
"""

from __future__ import annotations

import torch

from services.worker.models import llama, qwen3
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.moe import MoEModel, load_experts, random_weights
from services.worker.models.qwen3 import Qwen3Model
from services.worker.models.weights import Experts, LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig

Qwen2MoeModel = MoEModel  # Llama's attention (with Qwen2's QKV bias), the shared MLP of experts


class Qwen3MoeModel(MoEModel, Qwen3Model):
    """The experts' MLP (MoEModel) over Qwen3's attention (Qwen3Model's _qkv); neither folds."""


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """The checkpoint's tensors by Hugging Face's Qwen MoE names, in LightStream's layout (this rank's shard)."""
    layers = []
    for i in ckpt.progress(cfg.num_layers):
        p = f"model.layers.{i}."
        attention = llama.load_attention(ckpt, cfg, shard, p)
        if cfg.sparse(i):
            layers.append(_sparse_layer(ckpt, cfg, shard, p, attention))
        else:
            gate_up, down = llama.load_mlp(ckpt, shard, p + "mlp.")
            layers.append(LayerWeights(**attention, gate_up=gate_up, down=down))
    w = llama.assemble(ckpt, cfg, shard, layers)
    return qwen3.with_head_norms(ckpt, w) if cfg.family == "qwen3_moe" else w


def _sparse_layer(
    ckpt: Checkpoint, cfg: ModelConfig, shard: Shard, p: str, attention: dict[str, torch.Tensor | None]
) -> LayerWeights:
    names = ("gate_proj", "up_proj", "down_proj")
    w13, w2 = load_experts(ckpt, shard, p + "mlp.experts.", names, cfg.num_experts)
    router = ckpt.get(p + "mlp.gate.weight")  # [E, H]
    gate_up = down = None
    if cfg.shared_expert_intermediate_size:
        gate_up, down = llama.load_mlp(ckpt, shard, p + "mlp.shared_expert.")
        router = torch.cat([router, ckpt.get(p + "mlp.shared_expert_gate.weight").to(router.dtype)])  # [E + 1, H]
    experts = Experts(router=ckpt.put(router), w13=w13, w2=w2)
    return LayerWeights(**attention, gate_up=gate_up, down=down, experts=experts)


def qwen3_random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """A mixture of experts' random weights (moe.py) with Qwen3's head norms."""
    return qwen3.with_random_head_norms(random_weights(cfg, dtype, device, seed, tp), cfg, seed)
