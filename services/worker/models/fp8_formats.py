"""FP8 checkpoint tensors -> Fp8Weight (fp8_weight.py's one layout), and the quantizers that write
them (tools/make_tiny_model.py --quant fp8*), so each reader is tested without a download.

Beside each projection's e4m3 ``weight`` [N, K]:

- compressed-tensors: ``weight_scale`` float32, [1] (strategy tensor) or [N, 1] (strategy
  channel); W = weight * scale. A per-tensor scale becomes the same scale on every row,
  exactly. A static scheme's ``input_scale`` is not read (activations are quantized per token).
- Hugging Face fine-grained FP8: ``weight_scale_inv`` float32, [ceil(N / bn), ceil(K / bk)] for
  weight_block_size [bn, bk] (one scalar without one); W = weight * scale_inv of its block. A
  row of blocks has several scales, so a block checkpoint is dequantized and quantized again
  per output channel at load (a second rounding to e4m3, no block kernel needed).

Which tensors become Fp8Weight: the projections of the decoder's layers, a mixture of experts'
routed experts' too (moe.load_experts stacks them into an Fp8ExpertWeight). Anything else stored
in FP8 (an output layer not ignored) is read dequantized, in float32, and served in the serving
dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from services.worker.models.fp8_weight import FP8_MAX, MIN_SCALE, Fp8Weight, to_fp8
from services.worker.models.projections import is_projection
from shared.quant_config import WeightQuant


def _block_scales(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    """[ceil(N / bn), ceil(K / bk)] -> each weight's own scale [N, K]."""
    bn, bk = block
    return scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def dequantize(weight: torch.Tensor, scale: torch.Tensor, quant: WeightQuant) -> torch.Tensor:
    """A checkpoint's e4m3 weight [N, K] and its scale -> W [N, K] float32."""
    n, k = weight.shape
    s = scale.float()
    if s.numel() == 1:
        full = s.reshape(1, 1)
    elif quant.block != (0, 0):
        full = _block_scales(s, n, k, quant.block)
    else:
        full = s.reshape(n, 1)
    return weight.float() * full


def read(get: Callable[[str], torch.Tensor], stem: str, quant: WeightQuant) -> Fp8Weight:
    """The projection under stem ("...q_proj.") from a checkpoint's get(name)."""
    weight, scale = get(stem + "weight"), get(stem + quant.scale_name).float()
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{stem}weight is {weight.dtype}; an FP8 checkpoint's weights are float8_e4m3fn")
    n = weight.shape[0]
    if scale.numel() == 1:
        return Fp8Weight(weight, scale.reshape(1).expand(n).contiguous())
    if quant.block == (0, 0):
        return Fp8Weight(weight, scale.reshape(n).contiguous())
    return Fp8Weight.quantize(dequantize(weight, scale, quant))


# ---------------------------------------------------------------- writers (tiny checkpoints)

KINDS = ("fp8", "fp8-tensor", "fp8-block")  # per channel, per tensor (static input scale) and per block


def to_compressed(w: torch.Tensor, per_tensor: bool) -> dict[str, torch.Tensor]:
    """W [N, K] -> compressed-tensors' tensors by their checkpoint suffixes."""
    wf = w.float()
    amax = wf.abs().amax() if per_tensor else wf.abs().amax(1, keepdim=True)
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    out = {"weight": to_fp8(wf / scale), "weight_scale": scale.reshape(1) if per_tensor else scale}
    if per_tensor:  # a static scheme's calibrated input scale, which the loader leaves unread
        out["input_scale"] = torch.ones(1)
    return out


def to_block(w: torch.Tensor, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """W [N, K] -> Hugging Face fine-grained FP8's tensors (absmax / 448 of each block)."""
    bn, bk = block
    n, k = w.shape
    wf = torch.nn.functional.pad(w.float(), (0, -k % bk, 0, -n % bn))  # whole blocks; the padding is zeros
    blocks = wf.reshape(wf.shape[0] // bn, bn, wf.shape[1] // bk, bk)
    scale = (blocks.abs().amax((1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)  # [N / bn, K / bk]
    return {"weight": to_fp8(w.float() / _block_scales(scale, n, k, block)), "weight_scale_inv": scale}


def quantize_checkpoint(tensors: dict[str, torch.Tensor], kind: str, block: int) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors with every layer's projection (the routed experts' too) in kind's
    tensors; the embedding, the output layer, the norms and the routers as they were."""
    out = {}
    for name, t in tensors.items():
        if is_projection(name) and t.dim() == 2:
            stem = name.removesuffix("weight")
            parts = to_block(t, (block, block)) if kind == "fp8-block" else to_compressed(t, kind == "fp8-tensor")
            out |= {stem + k: v for k, v in parts.items()}
        else:
            out[name] = t
    return out


def quantization_config(kind: str, block: int) -> dict:
    """config.json's quantization_config for a checkpoint quantize_checkpoint wrote."""
    if kind == "fp8-block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [block] * 2}
    per_tensor = kind == "fp8-tensor"
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "tensor" if per_tensor else "channel"},
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": "tensor" if per_tensor else "token",
                    "dynamic": not per_tensor,
                },
            }
        },
        "ignore": ["lm_head"],
    }
