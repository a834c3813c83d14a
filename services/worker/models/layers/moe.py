"""A mixture-of-experts MLP's routing, and its routed experts in plain PyTorch: the CPU path and
the reference of the Triton kernels (kernels/moe_align.py, kernels/fused_moe.py).

The arithmetic is Hugging Face's (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock,
Qwen3MoeSparseMoeBlock): a softmax over every expert's router logit in float32, the top k of
those probabilities, renormalised to sum to one where the family does so; each chosen expert's
SiLU-gated MLP in the activation dtype, its output times the token's weight for it rounded to
the activation dtype, and the k outputs summed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.worker.models.fp8_weight import Fp8ExpertWeight
from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.weights import ExpertWeight


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool, weight_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] -> (weights [T, k] in weight_dtype, expert ids [T, k] int64), each
    token's experts in descending order of probability. weight_dtype: Mixtral's router keeps
    float32 weights, the Qwen routers round them to the logits' dtype. No host sync: it runs
    inside CUDA graphs."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(weight_dtype), ids


def experts_reference(
    x: torch.Tensor, w13: ExpertWeight, w2: ExpertWeight, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The routed experts of x [T, H]: w13 [E, 2I, H] (gate | up), w2 [E, H, I], weights and ids
    [T, k] from route -> [T, H] in x's dtype: sum over j of weights[t, j] * expert ids[t, j] (x[t]).
    A loop over the experts chosen, each over the tokens that chose it (index_select, index_add),
    as Hugging Face computes it; its shapes depend on the routing, so it is for the CPU only. An
    FP8 or int4 expert's weights are dequantized to x's dtype first (their reference products')."""
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for e in ids.unique().tolist():
        token, slot = torch.where(ids == e)  # [n] each: the tokens routed to e, and which of their k
        gate_up = x.index_select(0, token) @ _expert(w13, e, x.dtype).t()  # [n, 2I]
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = act @ _expert(w2, e, x.dtype).t()  # [n, H]
        out.index_add_(0, token, (y * weights[token, slot, None]).to(x.dtype))
    return out


def _expert(w: ExpertWeight, e: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert e's weight [N, K] in dtype (FP8, int4: dequantized, rounded once)."""
    return w[e].dequantize(dtype) if isinstance(w, (Fp8ExpertWeight, Int4ExpertWeight)) else w[e]
