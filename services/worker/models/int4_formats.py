"""AWQ's, GPTQ's and compressed-tensors' W4A16 4-bit checkpoint tensors -> Int4Weight
(int4_weight.py's one layout), and the quantizers that write them (tools/make_tiny_model.py
--quant), so each reader is tested without a download.

Per projection, AWQ and GPTQ store scales [K / G, N] (float16) beside:

- AWQ (AutoAWQ, version gemm): qweight [K, N / 8] and qzeros [K / G, N / 8] int32, eight
  output columns a word in the order 0 2 4 6 1 3 5 7 (nibble i, at bits 4i, holds column
  8w + AWQ_ORDER[i]); W = (q - zero) * scale.
- GPTQ (auto-gptq's and transformers' "gptq" format, the exllama kernels' input): qweight
  [K / 8, N] int32, input row 8i + j at bits 4j of word i; qzeros [K / G, N / 8], column 8w + j
  at bits 4j of word w, holding the zero point minus one; g_idx [K] (k // G when desc_act is
  false, which is all that is read). W = (q - (stored zero + 1)) * scale; symmetric: zero 8.
- compressed-tensors' W4A16 ("pack-quantized", llm-compressor's int4): weight_packed [N, K / 8]
  int32, input column 8i + j at bits 4j of word i, each value stored plus 8 (an offset code of
  a signed -8..7); weight_scale [N, K / G]; weight_shape [2]. Symmetric: W = (q - 8) * scale.
"""

from __future__ import annotations

from typing import Any

import torch

from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.int4_weight import Int4Weight, pack_cols, pack_rows, unpack_cols
from services.worker.models.projections import is_projection

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a word is nibble AWQ_REVERSE[j]


def _awq_unorder(q: torch.Tensor) -> torch.Tensor:
    """[R, C] as AWQ's words unpack (nibble order) -> columns in order."""
    return q.view(q.shape[0], -1, 8)[:, :, list(AWQ_REVERSE)].reshape(q.shape)


def _awq_order(q: torch.Tensor) -> torch.Tensor:
    return q.view(q.shape[0], -1, 8)[:, :, list(AWQ_ORDER)].reshape(q.shape)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> Int4Weight:
    q = _awq_unorder(unpack_cols(qweight))  # [K, N]
    z = _awq_unorder(unpack_cols(qzeros))  # [K / G, N]
    return Int4Weight(pack_rows(q), z, scales, group_size)


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> Int4Weight:
    z = (unpack_cols(qzeros).int() + 1).to(torch.uint8)  # the "gptq" format stores zero - 1
    return Int4Weight(qweight.to(torch.int32), z, scales, group_size)


def quantize(w: torch.Tensor, group_size: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W [N, K] -> (q [K, N], zeros [K / G, N], scales [K / G, N] float16) by round to nearest:
    asymmetric (AWQ's zero points: the group's range over 0..15) or symmetric (GPTQ's: zero 8,
    the largest magnitude at 7 steps)."""
    n, k = w.shape
    g = w.float().t().reshape(k // group_size, group_size, n)  # [K / G, G, N]
    if symmetric:
        scale = (g.abs().amax(1) / 7).clamp(min=1e-8)
        zero = torch.full_like(scale, 8.0)
    else:
        lo, hi = g.amin(1).clamp(max=0), g.amax(1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-8)
        zero = (-lo / scale).round().clamp(0, 15)
    scale = scale.half()
    q = (g / scale.float()[:, None, :]).round() + zero[:, None, :]
    return q.clamp(0, 15).reshape(k, n).to(torch.uint8), zero.to(torch.uint8), scale


def quantize_weight(w: torch.Tensor, group_size: int, symmetric: bool) -> Int4Weight:
    """W [N, K] -> an Int4Weight rounded to nearest as quantize does, its scales in W's dtype."""
    q, z, s = quantize(w, group_size, symmetric)
    return Int4Weight(pack_rows(q), z, s.to(w.dtype), group_size)


def quantize_experts(w: torch.Tensor, group_size: int, symmetric: bool) -> Int4ExpertWeight:
    """W [E, N, K] -> each expert as quantize_weight, one at a time."""
    out = Int4ExpertWeight.empty(w.shape[0], w.shape[1], w.shape[2], group_size, w.dtype, w.device)
    for e in range(w.shape[0]):
        out.place(e, 0, quantize_weight(w[e], group_size, symmetric))
    return out


def quantize_layers_(layers: list[Any], method: str, group_size: int = 128) -> None:
    """Each layer's projections (LayerWeights' qkv, o, gate_up, down and a sparse layer's routed
    experts) as method's int4 weights, in place: random weights drawn on the device (benchmarks),
    quantized as to_awq or to_gptq would write them, their scales in the weights' dtype."""
    symmetric = {"awq": False, "gptq": True}[method]
    for layer in layers:
        for name in ("qkv", "o", "gate_up", "down"):
            w = getattr(layer, name)
            if isinstance(w, torch.Tensor):
                setattr(layer, name, quantize_weight(w, group_size, symmetric))
        if layer.experts is not None:
            for name in ("w13", "w2"):
                setattr(layer.experts, name, quantize_experts(getattr(layer.experts, name), group_size, symmetric))


def from_w4a16(weight_packed: torch.Tensor, weight_scale: torch.Tensor, group_size: int) -> Int4Weight:
    q = unpack_cols(weight_packed).t()  # [K, N], offset codes: the zero point is 8
    z = torch.full(weight_scale.t().shape, 8, dtype=torch.uint8, device=q.device)
    return Int4Weight(pack_rows(q.contiguous()), z, weight_scale.t().contiguous(), group_size)


def to_awq(w: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """W [N, K] -> AWQ's tensors by their checkpoint suffixes."""
    q, z, s = quantize(w, group_size, symmetric=False)
    return {"qweight": pack_cols(_awq_order(q)), "qzeros": pack_cols(_awq_order(z)), "scales": s}


def to_gptq(w: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """W [N, K] -> GPTQ's tensors by their checkpoint suffixes (symmetric, desc_act false)."""
    q, z, s = quantize(w, group_size, symmetric=True)
    g_idx = torch.arange(w.shape[1], dtype=torch.int32) // group_size
    return {"qweight": pack_rows(q), "qzeros": pack_cols(z.int() - 1), "scales": s, "g_idx": g_idx}


def to_w4a16(w: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """W [N, K] -> compressed-tensors' pack-quantized tensors by their checkpoint suffixes."""
    q, _, s = quantize(w, group_size, symmetric=True)  # codes 0..15 about a zero point of 8
    shape = torch.tensor(list(w.shape), dtype=torch.int64)
    return {"weight_packed": pack_cols(q.t().contiguous()), "weight_scale": s.t().contiguous(), "weight_shape": shape}


PACKED = {"awq": "qweight", "gptq": "qweight", "w4a16": "weight_packed"}  # the tensor that marks a projection int4


def read(method: str, get, prefix: str, group_size: int) -> Int4Weight:
    """The projection under prefix ("...q_proj.") from a checkpoint's get(name)."""
    if method == "w4a16":
        return from_w4a16(get(prefix + "weight_packed"), get(prefix + "weight_scale"), group_size)
    qweight, qzeros, scales = (get(prefix + n) for n in ("qweight", "qzeros", "scales"))
    if method == "awq":
        return from_awq(qweight, qzeros, scales, group_size)
    if method == "gptq":
        return from_gptq(qweight, qzeros, scales, group_size)
    raise ValueError(f"int4 method {method!r}: awq, gptq or w4a16")


def quantize_checkpoint(tensors: dict[str, torch.Tensor], method: str, group_size: int) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with every layer's projection (a mixture of experts' routed experts
    too) in method's tensors (the embedding, the output layer, the norms and the routers as they
    were), as AutoAWQ and auto-gptq write them."""
    write = {"awq": to_awq, "gptq": to_gptq, "w4a16": to_w4a16}[method]
    out = {}
    for name, t in tensors.items():
        if is_projection(name):
            stem = name.removesuffix("weight")
            out |= {stem + k: v for k, v in write(t, group_size).items()}
        else:
            out[name] = t
    return out


def quantization_config(method: str, group_size: int) -> dict:
    """config.json's quantization_config for a checkpoint quantize_checkpoint wrote."""
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemm", "zero_point": True}
    if method == "w4a16":
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group_size}
        group = {"targets": ["Linear"], "weights": weights | {"actorder": None, "dynamic": False}}
        return {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {"group_0": group | {"input_activations": None, "output_activations": None}},
            "ignore": ["lm_head"],
        }
    return {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": group_size,
        "desc_act": False,
        "sym": True,
        "checkpoint_format": "gptq",
    }
