"""The Mixtral family (MixtralForCausalLM) over the token KV pool: Mistral's attention (llama.py)
and routed experts in every layer's MLP (moe.py).

What sets it apart is where it enters:
- the checkpoint (``load`` here): a layer's router is block_sparse_moe.gate.weight [E, H], and
  expert e's gate, up and down projections are block_sparse_moe.experts.{e}.w1, w3 and w2;
- the routing: Mixtral's experts are intermediate_size wide, and its router always
  renormalises the top-k weights and keeps them in float32 (shared/model_config.py, and
  ``float32_routing_weights`` here);
- the sliding window, which Mixtral applies whenever config.json gives one, as Mistral does:
  the context is capped at it, within which every position sees all its predecessors.
"""

from __future__ import annotations

from services.worker.models import llama
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.moe import MoEModel, load_experts
from services.worker.models.weights import Experts, LayerWeights, ModelWeights
from shared.model_config import ModelConfig


class MixtralModel(MoEModel):
    float32_routing_weights = True  # MixtralTopKRouter never rounds them back to the model's dtype


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """The checkpoint's tensors by Hugging Face's Mixtral names, in LightStream's layout (this rank's shard)."""
    layers = []
    for i in ckpt.progress(cfg.num_layers):
        p = f"model.layers.{i}."
        moe = p + "block_sparse_moe."
        w13, w2 = load_experts(ckpt, shard, moe + "experts.", ("w1", "w3", "w2"), cfg.num_experts)
        experts = Experts(router=ckpt.put(ckpt.get(moe + "gate.weight")), w13=w13, w2=w2)
        attention = llama.load_attention(ckpt, cfg, shard, p)
        layers.append(LayerWeights(**attention, gate_up=None, down=None, experts=experts))
    return llama.assemble(ckpt, cfg, shard, layers)
