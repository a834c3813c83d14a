"""The token-level KV pool (LightLLM's TokenAttention): K and V of every layer, one row per token slot.

A token slot is an index into every layer's buffers; which slots belong to a request is
kept in the request-to-token table (req_table.py) and which are free by the allocator
(token_allocator.py). The slot at index ``capacity`` is scratch: padded rows of a
CUDA-graph batch write there, so they never touch a live token.

A quantized pool stores each token's K and V per head as int8 with a float32 scale (absmax /
127), or as FP8 e4m3 with a power-of-two scale kept as its int8 exponent (the smallest 2^e not
under absmax / 448): about half the bytes of bf16 per token. A floating-point format's precision
does not depend on where in its range a value sits, so e4m3 loses nothing to a power-of-two
scale but range it has to spare, and the scale costs one byte a head instead of four (head dim
64: 1.97x bf16's tokens instead of 1.88x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    kv_heads: int  # this rank's share of the KV heads
    head_dim: int
    dtype: torch.dtype  # the model's activation dtype
    quantized: bool  # int8 or e4m3 storage with per-token, per-head scales
    quant_dtype: torch.dtype = torch.int8  # a quantized pool's storage: int8 or float8_e4m3fn

    @property
    def scale_dtype(self) -> torch.dtype:
        """A quantized pool's scales: float32, or int8 exponents for e4m3 values."""
        return SCALE_DTYPES[self.quant_dtype]

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token slot costs over all layers, K and V."""
        if self.quantized:
            per_layer = self.kv_heads * (self.head_dim * 1 + self.scale_dtype.itemsize)
        else:
            per_layer = self.kv_heads * self.head_dim * torch.finfo(self.dtype).bits // 8
        return 2 * self.num_layers * per_layer


class KVCache:
    def __init__(self, layout: KVLayout, capacity: int, device: torch.device | str) -> None:
        if capacity < 1:
            raise ValueError(f"KV capacity must be >= 1 token, got {capacity}")
        self.layout = layout
        self.capacity = capacity
        self.dummy_slot = capacity
        rows = capacity + 1
        shape = (rows, layout.kv_heads, layout.head_dim)  # [slots, kv_heads, head_dim]
        store_dtype = layout.quant_dtype if layout.quantized else layout.dtype
        self.k = [torch.zeros(shape, dtype=store_dtype, device=device) for _ in range(layout.num_layers)]
        self.v = [torch.zeros(shape, dtype=store_dtype, device=device) for _ in range(layout.num_layers)]
        self.k_scale: list[torch.Tensor] | None = None
        self.v_scale: list[torch.Tensor] | None = None
        if layout.quantized:
            scale_shape = (rows, layout.kv_heads)  # [slots, kv_heads]
            one = 1 if layout.scale_dtype.is_floating_point else 0  # 2^0
            self.k_scale = [
                torch.full(scale_shape, one, dtype=layout.scale_dtype, device=device) for _ in range(layout.num_layers)
            ]
            self.v_scale = [
                torch.full(scale_shape, one, dtype=layout.scale_dtype, device=device) for _ in range(layout.num_layers)
            ]

    def dequantized(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the given slots in the activation dtype: [n, kv_heads, head_dim] each."""
        k = self.k[layer][slots]
        v = self.v[layer][slots]
        if self.layout.quantized:
            assert self.k_scale is not None and self.v_scale is not None
            k = (k.float() * scale_values(self.k_scale[layer][slots])[..., None]).to(self.layout.dtype)
            v = (v.float() * scale_values(self.v_scale[layer][slots])[..., None]).to(self.layout.dtype)
        return k, v


KV_QUANT_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}  # --kv-dtype -> a quantized pool's storage
SCALE_DTYPES = {torch.int8: torch.float32, torch.float8_e4m3fn: torch.int8}  # a quantized pool's scales
FP8_MAX = 448.0


def scale_values(s: torch.Tensor) -> torch.Tensor:
    """Scales as a pool keeps them -> float32: an int8 exponent e stands for 2^e."""
    return _pow2(s.to(torch.int32)) if s.dtype == torch.int8 else s


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """int32 e in [-126, 127] -> float32 2^e, exactly (its bits)."""
    return ((e + 127) << 23).view(torch.float32)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [n, heads, dim] -> (values [n, heads, dim] in dtype, int8 or e4m3; float32 scales [n, heads])."""
    return quantize_int8(x) if dtype == torch.int8 else quantize_fp8(x)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [n, heads, dim] -> (e4m3 values [n, heads, dim], int8 exponents e [n, heads]): 2^e is the
    smallest power of two not under the head's absmax / 448 (from that quotient's bits), each value
    times 2^-e (exact) rounded to the nearest e4m3, ties to even."""
    absmax = x.float().abs().amax(dim=-1)
    bits = (torch.clamp(absmax, min=1e-8) / FP8_MAX).view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    q = (x.float() * _pow2(-e)[..., None]).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, e.to(torch.int8)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [n, heads, dim] -> (int8 values [n, heads, dim], float32 scales [n, heads])."""
    absmax = x.float().abs().amax(dim=-1)
    scale = torch.clamp(absmax, min=1e-8) / 127.0
    q = torch.round(x.float() / scale[..., None]).clamp_(-127, 127).to(torch.int8)
    return q, scale
