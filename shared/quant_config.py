"""A checkpoint's weight quantization, as its config.json's quantization_config says (or as
``--quantization fp8`` asks): what the worker can read, and a refusal naming what was found and
what is supported for anything else.

Parsed without torch (the front end and ``lightstream serve``'s model check read it too).
Supported:

- 4-bit AWQ (the GEMM layout, zero points) and 4-bit GPTQ (symmetric, desc_act false, the
  "gptq" checkpoint format: stored zero points one below the real ones), group size 128 or any
  power of two from 32; any family, Phi-3's fused projections and a mixture of experts' routed
  experts included.
- compressed-tensors' W4A16 ("pack-quantized": 4-bit int weights, symmetric, a scale a group,
  actorder none or "weight"), read into the same int4 layout as GPTQ's.
- FP8 e4m3: compressed-tensors' "float-quantized" format (8-bit float weights, per-tensor or
  per-channel ``weight_scale``; input scales dynamic or static: activations are quantized per
  token whatever the checkpoint calibrated) and Hugging Face's fine-grained FP8 (quant_method
  "fp8", ``weight_scale_inv`` per block of weight_block_size, or per tensor without one). Any
  family, a mixture of experts' routed experts included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SUPPORTED = (
    "4-bit AWQ (version gemm, zero_point true), 4-bit GPTQ (sym true, desc_act false, format gptq), "
    "compressed-tensors pack-quantized W4A16 (4-bit int weights, symmetric, strategy group, actorder none "
    "or weight), "
    "compressed-tensors float-quantized FP8 (8-bit float weights, strategy tensor or channel) or "
    "Hugging Face fine-grained FP8 (quant_method fp8, e4m3, weight_block_size [rows, cols] or none)"
)
GROUP_SIZES = (32, 64, 128, 256)
INT4_METHODS = ("awq", "gptq", "w4a16")  # w4a16: compressed-tensors' pack-quantized int4
FP8_SCALES = ("weight_scale", "weight_scale_inv", "")  # compressed-tensors', HF fine-grained's; "": made at load


class QuantConfigError(ValueError):
    pass


@dataclass(frozen=True)
class WeightQuant:
    method: str  # awq | gptq | w4a16 | fp8
    bits: int  # 4, or 8 for fp8
    group_size: int  # int4: input columns sharing one scale and zero point; fp8: 0
    scale_name: str = (
        ""  # fp8: the checkpoint's scale tensor suffix (FP8_SCALES); "": a bf16 checkpoint quantized at load
    )
    block: tuple[int, int] = (0, 0)  # fp8 weight_scale_inv's block [rows, cols]; (0, 0): per tensor or channel

    def __post_init__(self) -> None:
        if self.method == "fp8":
            if self.bits != 8 or self.scale_name not in FP8_SCALES or min(self.block) < 0:
                raise QuantConfigError(
                    f"fp8 with {self.bits} bits, scales {self.scale_name!r}, block {list(self.block)} is not "
                    f"supported; supported: {SUPPORTED}"
                )
        elif self.method not in INT4_METHODS or self.bits != 4 or self.group_size not in GROUP_SIZES:
            raise QuantConfigError(
                f"quantization {self.method} with {self.bits} bits, group size {self.group_size} is not supported; "
                f"supported: {SUPPORTED}, group size one of {GROUP_SIZES}"
            )

    @property
    def at_load(self) -> bool:
        """FP8 made from a bf16 checkpoint's weights as they load (--quantization fp8)."""
        return self.method == "fp8" and not self.scale_name


FP8_AT_LOAD = WeightQuant("fp8", 8, 0)


def parse_quantization(raw: dict[str, Any]) -> WeightQuant | None:
    """config.json's quantization_config -> what the loader reads (None: unquantized weights)."""
    q = raw.get("quantization_config")
    if not q:
        return None
    method = str(q.get("quant_method", "?")).lower()
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "fp8":
        return _fine_grained_fp8(q)
    bits = int(q.get("bits", q.get("w_bit", 0)) or 0)
    group = int(q.get("group_size", q.get("q_group_size", 0)) or 0)
    found = f"{method}, {bits} bits, group size {group}"
    if method == "awq":
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm" or not q.get("zero_point", True):
            raise QuantConfigError(
                f"AWQ version {version!r}, zero_point {q.get('zero_point')} is not supported; supported: {SUPPORTED}"
            )
    elif method == "gptq":
        fmt = str(q.get("checkpoint_format", "gptq")).lower()
        if q.get("desc_act") or not q.get("sym", True) or fmt != "gptq":
            raise QuantConfigError(
                f"GPTQ with desc_act {q.get('desc_act')}, sym {q.get('sym')}, checkpoint_format {fmt!r} "
                f"({found}) is not supported; supported: {SUPPORTED}"
            )
    else:
        raise QuantConfigError(f"quantization method {method!r} ({found}) is not supported; supported: {SUPPORTED}")
    return WeightQuant(method, bits, group)


def _compressed_tensors(q: dict[str, Any]) -> WeightQuant:
    """compressed-tensors' FP8: every config group's weights 8-bit float, per tensor or channel;
    or its W4A16 (pack-quantized)."""
    fmt = str(q.get("format", "?"))
    if fmt == "pack-quantized":
        return _pack_quantized(q)
    if fmt != "float-quantized":
        raise QuantConfigError(f"compressed-tensors format {fmt!r} is not supported; supported: {SUPPORTED}")
    for name, group in (q.get("config_groups") or {}).items():
        for role, scheme in (("weights", group.get("weights")), ("input_activations", group.get("input_activations"))):
            if scheme is None and role == "input_activations":
                continue  # weight-only FP8: activations are quantized per token all the same
            scheme = scheme or {}
            found = (
                f"{role} of {name}: {scheme.get('num_bits')} bits, type {scheme.get('type')!r}, "
                f"strategy {scheme.get('strategy')!r}"
            )
            strategies = ("tensor", "channel") if role == "weights" else ("tensor", "token")
            if scheme.get("num_bits") != 8 or scheme.get("type") != "float" or scheme.get("strategy") not in strategies:
                raise QuantConfigError(f"compressed-tensors {found} is not supported; supported: {SUPPORTED}")
    if q.get("kv_cache_scheme"):
        log.warning("the checkpoint's KV cache scales are not read: --kv-dtype fp8 computes per-token scales")
    return WeightQuant("fp8", 8, 0, scale_name="weight_scale")


def _pack_quantized(q: dict[str, Any]) -> WeightQuant:
    """compressed-tensors' W4A16 (llm-compressor's default int4 scheme): every config group's
    weights 4-bit int, symmetric, one scale a group of input columns; no activation quantization.
    actorder "weight" reorders only the quantizer's pass (the groups stay contiguous); "group"
    would need each column's group index, which is not read."""
    groups = set()
    for name, group in (q.get("config_groups") or {}).items():
        w, acts = group.get("weights") or {}, group.get("input_activations")
        found = (
            f"weights of {name}: {w.get('num_bits')} bits, type {w.get('type')!r}, symmetric {w.get('symmetric')}, "
            f"strategy {w.get('strategy')!r}, actorder {w.get('actorder')!r}, input activations {acts}"
        )
        ok = (w.get("num_bits"), w.get("type"), w.get("symmetric"), w.get("strategy")) == (4, "int", True, "group")
        if not ok or w.get("actorder") not in (None, "weight") or acts:
            raise QuantConfigError(
                f"compressed-tensors pack-quantized {found} is not supported; supported: {SUPPORTED}"
            )
        groups.add(int(w.get("group_size") or 0))
    if not groups:
        raise QuantConfigError(f"compressed-tensors pack-quantized without config_groups; supported: {SUPPORTED}")
    if len(groups) != 1:
        raise QuantConfigError(f"compressed-tensors pack-quantized with group sizes {sorted(groups)}: one is supported")
    return WeightQuant("w4a16", 4, groups.pop())


def _fine_grained_fp8(q: dict[str, Any]) -> WeightQuant:
    """Hugging Face's fine-grained FP8: weight_scale_inv per block of weight_block_size (or per tensor)."""
    fmt = str(q.get("fmt", "e4m3")).lower()
    block = q.get("weight_block_size")
    if fmt != "e4m3" or (block is not None and (len(block) != 2 or min(int(b) for b in block) < 1)):
        raise QuantConfigError(
            f"fp8 with fmt {fmt!r}, weight_block_size {block} is not supported; supported: {SUPPORTED}"
        )
    return WeightQuant("fp8", 8, 0, scale_name="weight_scale_inv", block=tuple(int(b) for b in block or (0, 0)))


def with_flag(found: WeightQuant | None, quantization: str) -> WeightQuant | None:
    """The checkpoint's quantization under the --quantization flag: "fp8" quantizes a bf16 (or
    float) checkpoint's projections at load, and is already so for an FP8 checkpoint; "none"
    serves the checkpoint as it is."""
    if quantization == "none" or (found is not None and found.method == "fp8"):
        return found
    if quantization != "fp8":
        raise QuantConfigError(f"--quantization {quantization!r} is not supported; supported: none, fp8")
    if found is not None:
        raise QuantConfigError(
            f"--quantization fp8 on a {found.method} {found.bits}-bit checkpoint is not supported; "
            "supported: a bf16, float16 or float32 checkpoint, or an FP8 one"
        )
    return FP8_AT_LOAD
