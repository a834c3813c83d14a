"""A checkpoint's weight quantization, as its config.json's quantization_config says: what the
worker can read, and a refusal naming what was found and what is supported for anything else.

Parsed without torch (the front end and ``lightstream serve``'s model check read it too).
Supported: 4-bit AWQ (the GEMM layout, zero points) and 4-bit GPTQ (symmetric, desc_act false,
the "gptq" checkpoint format: stored zero points one below the real ones), group size 128 or
any power of two from 32; dense families only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED = "4-bit AWQ (version gemm, zero_point true) or 4-bit GPTQ (sym true, desc_act false, format gptq)"
GROUP_SIZES = (32, 64, 128, 256)


class QuantConfigError(ValueError):
    pass


@dataclass(frozen=True)
class WeightQuant:
    method: str  # awq | gptq
    bits: int  # 4
    group_size: int  # input columns sharing one scale and zero point

    def __post_init__(self) -> None:
        if self.method not in ("awq", "gptq") or self.bits != 4 or self.group_size not in GROUP_SIZES:
            raise QuantConfigError(
                f"quantization {self.method} with {self.bits} bits, group size {self.group_size} is not supported; "
                f"supported: {SUPPORTED}, group size one of {GROUP_SIZES}"
            )


def parse_quantization(raw: dict[str, Any], moe: bool) -> WeightQuant | None:
    """config.json's quantization_config -> what the loader reads (None: unquantized weights)."""
    q = raw.get("quantization_config")
    if not q:
        return None
    method = str(q.get("quant_method", "?")).lower()
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
    if moe:
        raise QuantConfigError(f"a quantized mixture of experts ({found}) is not supported; dense families only")
    return WeightQuant(method, bits, group)
