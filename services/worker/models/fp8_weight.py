"""An FP8 projection weight (e4m3, one float32 scale per output channel), and the reference
product that reads it.

    weight [N, K] float8_e4m3fn
    scale  [N]    float32
    W[n, k] = weight[n, k] * scale[n]

Every FP8 source ends in this one layout: a bf16 checkpoint quantized at load
(``--quantization fp8``), compressed-tensors' per-tensor and per-channel checkpoints (a
per-tensor scale repeated over the channels, exactly) and Hugging Face's fine-grained block
checkpoints (dequantized, then quantized per channel again at load: models/fp8_formats.py).

Like Int4Weight it stands where a family's code holds a weight tensor [N, K]: the loaders'
cuts and joins (``shape``, ``chunk``, ``split``, ``torch.cat`` along N, ``to``) work on it as on
a tensor. A cut along outputs (column-parallel) cuts the scale with its rows; a cut along
inputs (row-parallel) keeps each row's scale whole. The projection strategy
(layers/projection.py) routes it to layers/fp8_product.py.

A mixture of experts' routed experts hold one projection of every expert stacked, as the
grouped GEMM (kernels/fused_moe.py) reads it: ``Fp8ExpertWeight``, weight [E, N, K] e4m3 and
scale [E, N] float32, expert e's being Fp8Weight(weight[e], scale[e]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # e4m3's largest finite value
MIN_SCALE = 1e-12  # a row of zeros keeps a positive scale


class Fp8LayoutError(ValueError):
    pass


@dataclass
class Fp8Weight:
    weight: torch.Tensor  # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [N] float32

    def __post_init__(self) -> None:
        if self.weight.dtype != FP8 or self.scale.dtype != torch.float32:
            raise Fp8LayoutError(
                f"fp8 weight: e4m3 weight and float32 scale, got {self.weight.dtype}, {self.scale.dtype}"
            )
        if self.weight.dim() != 2 or self.scale.shape != self.weight.shape[:1]:
            raise Fp8LayoutError(
                f"fp8 weight {tuple(self.weight.shape)}: scale {tuple(self.scale.shape)} should be one per output row"
            )

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8Weight:
        """W [N, K] -> e4m3 with each row's scale absmax / 448 (the row's largest magnitude lands
        on e4m3's largest value), rounded to nearest even."""
        wf = w.float()
        scale = (wf.abs().amax(1) / FP8_MAX).clamp(min=MIN_SCALE)  # [N]
        return cls(to_fp8(wf / scale[:, None]), scale)

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def dtype(self) -> torch.dtype:
        return FP8

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """-> W [N, K]: weight * scale in float32, rounded once to dtype."""
        return (self.weight.float() * self.scale[:, None]).to(dtype)

    def chunk(self, chunks: int, dim: int = 0) -> list[Fp8Weight]:
        if dim == 0:
            return [
                Fp8Weight(w, s) for w, s in zip(self.weight.chunk(chunks, 0), self.scale.chunk(chunks), strict=True)
            ]
        return [Fp8Weight(w, self.scale) for w in self.weight.chunk(chunks, 1)]

    def split(self, sizes: list[int], dim: int = 0) -> list[Fp8Weight]:
        """Rows in the given counts (phi3's fused q | k | v and gate | up)."""
        if dim != 0:
            raise Fp8LayoutError("an fp8 weight splits along its outputs only")
        return [Fp8Weight(w, s) for w, s in zip(self.weight.split(sizes), self.scale.split(sizes), strict=True)]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Fp8Weight:
        """On device; the weight stays e4m3 and the scale float32 whatever the serving dtype."""
        return replace(self, weight=self.weight.to(device), scale=self.scale.to(device))

    def contiguous(self) -> Fp8Weight:
        return replace(self, weight=self.weight.contiguous(), scale=self.scale.contiguous())

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """torch.cat of fp8 weights along outputs (q | k | v, gate | up); nothing else."""
        kwargs = kwargs or {}
        if func is torch.cat and kwargs.get("dim", args[1] if len(args) > 1 else 0) == 0:
            ws = list(args[0])
            if all(isinstance(w, Fp8Weight) for w in ws):
                return Fp8Weight(torch.cat([w.weight for w in ws]), torch.cat([w.scale for w in ws]))
        raise TypeError(f"{getattr(func, '__name__', func)} is not defined for fp8 weights (only torch.cat on dim 0)")


@dataclass
class Fp8ExpertWeight:
    """One projection of every routed expert: weight [E, N, K] e4m3, scale [E, N] float32 (each
    expert's rows' scales); W[e, n, k] = weight[e, n, k] * scale[e, n]."""

    weight: torch.Tensor  # [E, N, K] float8_e4m3fn
    scale: torch.Tensor  # [E, N] float32

    def __post_init__(self) -> None:
        if self.weight.dtype != FP8 or self.scale.dtype != torch.float32:
            raise Fp8LayoutError(
                f"fp8 experts: e4m3 weight and float32 scale, got {self.weight.dtype}, {self.scale.dtype}"
            )
        if self.weight.dim() != 3 or self.scale.shape != self.weight.shape[:2]:
            raise Fp8LayoutError(
                f"fp8 experts {tuple(self.weight.shape)}: scale {tuple(self.scale.shape)} should be [E, N]"
            )

    @classmethod
    def empty(cls, experts: int, n: int, k: int, device: torch.device | str) -> Fp8ExpertWeight:
        """Room for experts' [n, k] weights, filled one expert at a time (moe.load_experts)."""
        return cls(torch.empty(experts, n, k, dtype=FP8, device=device), torch.empty(experts, n, device=device))

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8ExpertWeight:
        """W [E, N, K] -> each expert quantized by Fp8Weight.quantize (absmax / 448 a row), one
        at a time (a float32 copy of one expert at most)."""
        out = cls.empty(w.shape[0], w.shape[1], w.shape[2], w.device)
        for e in range(w.shape[0]):
            out.place(e, 0, Fp8Weight.quantize(w[e]))
        return out

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    @property
    def dtype(self) -> torch.dtype:
        return FP8

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def dim(self) -> int:
        return 3

    def __getitem__(self, e: int) -> Fp8Weight:
        """Expert e's projection."""
        return Fp8Weight(self.weight[e], self.scale[e])

    def is_contiguous(self) -> bool:
        return self.weight.is_contiguous() and self.scale.is_contiguous()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """-> W [E, N, K]: weight * scale in float32, rounded once to dtype."""
        return (self.weight.float() * self.scale[:, :, None]).to(dtype)

    def place(self, e: int, start: int, w: Fp8Weight) -> None:
        """Expert e's rows start .. start + w's rows set to w's (its weight and its scales)."""
        rows = slice(start, start + w.shape[0])
        self.weight[e, rows].copy_(w.weight)
        self.scale[e, rows].copy_(w.scale)


def quantize_layers_(layers: list[Any]) -> None:
    """Each layer's projections (LayerWeights' qkv, o, gate_up, down and a sparse layer's routed
    experts) quantized in place: random weights drawn per rank (benchmarks), where there is no
    whole checkpoint tensor."""
    for layer in layers:
        for name in ("qkv", "o", "gate_up", "down"):
            w = getattr(layer, name)
            if isinstance(w, torch.Tensor):
                setattr(layer, name, Fp8Weight.quantize(w))
        experts = layer.experts
        if experts is not None and isinstance(experts.w13, torch.Tensor):
            experts.w13 = Fp8ExpertWeight.quantize(experts.w13)
            experts.w2 = Fp8ExpertWeight.quantize(experts.w2)


def quantize_lm_head_(weights: Any) -> None:
    """ModelWeights' output layer in FP8 (--fp8-lm-head): a tied one becomes an FP8 copy, and the
    embedding it was stays as it is (a lookup reads a row, not the whole table)."""
    if isinstance(weights.lm_head, torch.Tensor):
        weights.lm_head = Fp8Weight.quantize(weights.lm_head)


def to_fp8(x: torch.Tensor) -> torch.Tensor:
    """float32 values already scaled into e4m3's range -> e4m3, clamped first (a value past 448
    by rounding error saturates instead of becoming NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def fp8_reference(
    x: torch.Tensor, w: Fp8Weight, out: torch.Tensor | None = None, accumulate: bool = False
) -> torch.Tensor:
    """x [T, K] @ W.t() with W dequantized to x's dtype (activations as they are): the CPU path,
    the exact twin of Hugging Face run on the dequantized weights."""
    wd = w.dequantize(x.dtype)
    if accumulate:
        assert out is not None, "accumulate needs out"
        return out.addmm_(x, wd.t())
    return x @ wd.t() if out is None else torch.mm(x, wd.t(), out=out)
