"""Each layer's RMSNorm weights folded into the projection that reads the norm's output.

rmsnorm(x) @ W.t() is (x * r * g) @ W.t() with r = rsqrt(mean(x^2) + eps) per row and g the
norm's weight over W's input dim, which is r * (x @ (W * g).t()). With g folded into the QKV
and gate|up weights, a decode step needs no norm kernel: the products read the residual
stream itself, the kernels after them (decode attention, silu_mul) scale their rows by r,
which they compute from the residual (ops.RowNorm), and the o and down products add into the
residual in place (a GEMM with beta 1) instead of a kernel adding them. That is two kernels a
layer fewer (LlamaModel.decode_folded). The other steps keep their norm kernels, with weights
of ones, which leave a row as the unfolded norm would before its weight.

The final norm, before the LM head, is not folded: it runs on the sampled rows only.
"""

from __future__ import annotations

import torch

from services.worker.models.llama import ModelWeights


@torch.no_grad()
def fold_norms_(weights: ModelWeights) -> None:
    """Fold each layer's attention and MLP norm into its QKV and gate|up weights, in place (no
    second copy of the weights is ever held: an 8B model's would take 9 GiB from the KV pool);
    the norms' own weights become ones and weights.folded is set. Each product is computed in
    float32 and rounded once to the weights' dtype, as PyTorch's in-place multiply does."""
    if weights.folded:
        return
    if any(layer.qkv_bias is not None for layer in weights.layers):
        # r * (x @ W.t()) + b is not what the unfolded layer computes, (r x g) @ W.t() + b
        raise ValueError("fold_norms_: a QKV bias cannot follow a folded norm")
    for layer in weights.layers:
        layer.qkv.mul_(layer.attn_norm[None, :])
        layer.attn_norm.fill_(1.0)
        layer.gate_up.mul_(layer.mlp_norm[None, :])
        layer.mlp_norm.fill_(1.0)
    weights.folded = True
