"""A decoder's weights in LightStream's layout, and what one piece of a forward hands the next.

q, k and v are one projection and gate and up another, so each is one matmul. Under tensor
parallelism each rank holds its share: q, k, v, gate and up by output rows; o and down by
input columns; the embedding and the output layer by vocabulary rows. A mixture-of-experts
layer's routed experts (``Experts``) are cut the same way, each expert's gate and up by rows
and its down by columns; its router is whole on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.worker.models.fp8_weight import Fp8ExpertWeight
from services.worker.models.int4_experts import Int4ExpertWeight

# one projection of every routed expert [E, N, K]: in the serving dtype, FP8 with a scale a row,
# or AWQ's / GPTQ's int4 with a scale and zero point a group
ExpertWeight = torch.Tensor | Fp8ExpertWeight | Int4ExpertWeight


@dataclass
class Experts:
    """A mixture-of-experts layer's routed experts (models/moe.py) and its router."""

    router: torch.Tensor  # [E, H], whole on every rank; with a shared expert, its gate's row after them: [E + 1, H]
    w13: ExpertWeight  # [E, 2 * I, H]: each expert's gate rows, then its up rows (this rank's share of each)
    w2: ExpertWeight  # [E, H, I]: each expert's down projection (this rank's columns)


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 * Hkv) * D, H], this rank's heads
    qkv_bias: torch.Tensor | None  # [(Hq + 2 * Hkv) * D]
    o: torch.Tensor  # [H, Hq * D]
    mlp_norm: torch.Tensor  # [H]
    # the dense MLP: this rank's share of the intermediate size. A mixture-of-experts layer's is
    # its shared expert (Qwen2-MoE), or None where its MLP is the routed experts alone
    gate_up: torch.Tensor | None  # [2 * I, H]
    down: torch.Tensor | None  # [H, I]
    experts: Experts | None = field(default=None, kw_only=True)  # a mixture-of-experts layer's routed experts


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V / tp, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V / tp, H]; the embedding itself when tied
    vocab_start: int = 0  # first token id of this rank's vocabulary shard


@dataclass
class Carry:
    """What one piece of a forward hands the next."""

    residual: torch.Tensor  # [T, H], the residual stream so far
    h: torch.Tensor | None = None  # [T, H], the last piece's: the last MLP's output, not yet in the residual
    q: torch.Tensor | None = None  # [T, Hq, D], the next layer's attention inputs (its K and V already stored)
    k: torch.Tensor | None = None  # [T, Hkv, D]
    v: torch.Tensor | None = None
