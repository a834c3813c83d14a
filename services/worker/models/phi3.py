"""The Phi-3 family (dense) over the token KV pool: Llama's math (llama.py) on a checkpoint that
stores q, k and v as one tensor and gate and up as another, with LongRoPE's rotary table.

Nothing in the forward differs from Llama's, so the model class is ``LlamaModel``; what sets
Phi-3 apart lives where it enters:

- the checkpoint (``load`` here): self_attn.qkv_proj.weight [(Hq + 2 Hkv) D, H] and
  mlp.gate_up_proj.weight [2 I, H] are LightStream's fused layout already. Under tensor
  parallelism a rank's share is its rows of q, of k and of v (and of gate and of up), so each
  fused tensor is split into its parts first, each part cut by rows, and the cuts joined;
- LongRoPE (models/layers/rope.py): a factor per rotary frequency and an attention factor on
  cos and sin, all in the table the kernels look rows up in; contexts beyond
  original_max_position_embeddings, where Hugging Face switches to the long factors, are not
  served (shared/model_config.py);
- the sliding window: config.json's window applies whenever given; the context is capped at
  it, within which every position sees all its predecessors, exactly (shared/model_config.py).

The norms fold (``folds_norms`` True, from LlamaModel): Phi-3's RMSNorm is Llama's, nothing sits
between the QKV projection and rotary, there is no QKV bias, and LongRoPE's attention factor is
in the rotary table, which is linear in q and k, so scaling q, k and v by the norm's factor
before rotary is the unfolded layer's arithmetic.
"""

from __future__ import annotations

import torch

from services.worker.models import llama
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.weights import LayerWeights, ModelWeights
from shared.model_config import ModelConfig

ARCHITECTURES = ("Phi3ForCausalLM",)

Phi3Model = llama.LlamaModel  # the same forward; the differences are in the weights and the rotary table


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """The checkpoint's tensors by Hugging Face's Phi-3 names, in LightStream's layout (this rank's shard)."""
    put = ckpt.put
    q_rows, kv_rows = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layers = []
    for i in ckpt.progress(cfg.num_layers):
        p = f"model.layers.{i}."
        qkv = ckpt.get(p + "self_attn.qkv_proj.weight").split([q_rows, kv_rows, kv_rows])  # q, k, v: [rows, H]
        gate_up = ckpt.get(p + "mlp.gate_up_proj.weight").chunk(2)  # gate, up: [I, H]
        layers.append(
            LayerWeights(
                attn_norm=put(ckpt.get(p + "input_layernorm.weight")),
                qkv=put(torch.cat([shard.rows(t) for t in qkv])),
                qkv_bias=None,
                o=put(shard.cols(ckpt.get(p + "self_attn.o_proj.weight"))),
                mlp_norm=put(ckpt.get(p + "post_attention_layernorm.weight")),
                gate_up=put(torch.cat([shard.rows(t) for t in gate_up])),
                down=put(shard.cols(ckpt.get(p + "mlp.down_proj.weight"))),
            )
        )
    return llama.assemble(ckpt, cfg, shard, layers)
