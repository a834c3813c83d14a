"""A weight-only int4 projection weight (AWQ's and GPTQ's checkpoints, read by int4_formats.py), in
one layout whatever the checkpoint's, and the product that reads it.

    qweight [K / 8, N] int32: eight 4-bit values of input rows 8i..8i+7 of column n, row 8i + j
                              at bits 4j (GPTQ's own layout; AWQ's is repacked at load)
    zeros   [K / G, N] uint8: each group's zero point (0..15)
    scales  [K / G, N]:       each group's scale, in the serving dtype
    W[n, k] = (q[k, n] - zeros[k // G, n]) * scales[k // G, n]

It stands where a family's code holds a weight tensor [N, K] (LayerWeights' qkv, o, gate_up,
down): the loaders' cuts and concatenations (``shape``, ``chunk``, ``torch.cat`` along N,
``to``) work on it as on a tensor, so no family file knows, and the projection strategy
(layers/projection.py) routes it here: the Triton kernel on CUDA (kernels/int4_matmul.py), else
the reference, which dequantizes then multiplies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch


class Int4LayoutError(ValueError):
    pass


@dataclass
class Int4Weight:
    qweight: torch.Tensor  # [K / 8, N] int32
    zeros: torch.Tensor  # [K / G, N] uint8
    scales: torch.Tensor  # [K / G, N]
    group_size: int

    def __post_init__(self) -> None:
        k8, n = self.qweight.shape
        groups = k8 * 8 // self.group_size
        if self.qweight.dtype != torch.int32 or self.zeros.dtype != torch.uint8:
            raise Int4LayoutError(
                f"int4 weight: qweight int32 and zeros uint8, got {self.qweight.dtype}, {self.zeros.dtype}"
            )
        if (k8 * 8) % self.group_size or self.zeros.shape != (groups, n) or self.scales.shape != (groups, n):
            raise Int4LayoutError(
                f"int4 weight of {k8 * 8} inputs, {n} outputs, group size {self.group_size}: zeros "
                f"{tuple(self.zeros.shape)} and scales {tuple(self.scales.shape)} should be ({groups}, {n})"
            )

    @property
    def shape(self) -> torch.Size:
        """The dequantized weight's shape, [N, K], as a tensor weight's."""
        return torch.Size((self.qweight.shape[1], self.qweight.shape[0] * 8))

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """-> W [N, K] in dtype (scales' by default): (q - zero) * scale in float32, rounded once."""
        g = self.group_size
        q = unpack_rows(self.qweight).int()  # [K, N]
        z = self.zeros.int().repeat_interleave(g, dim=0)
        s = self.scales.float().repeat_interleave(g, dim=0)
        return ((q - z).float() * s).to(dtype or self.dtype).t().contiguous()

    def chunk(self, chunks: int, dim: int = 0) -> list[Int4Weight]:
        """A tensor's chunk over the dequantized [N, K]: dim 0 cuts outputs (columns of the packed
        tensors), dim 1 cuts inputs (whole groups of packed rows)."""
        if dim == 0:
            parts = zip(*(t.chunk(chunks, 1) for t in (self.qweight, self.zeros, self.scales)), strict=True)
            return [Int4Weight(q, z, s, self.group_size) for q, z, s in parts]
        k = self.shape[1]
        if k % (chunks * self.group_size):
            raise Int4LayoutError(
                f"an int4 weight's {k} inputs do not split over {chunks} ranks in whole groups of {self.group_size}"
            )
        qs, zs, ss = self.qweight.chunk(chunks, 0), self.zeros.chunk(chunks, 0), self.scales.chunk(chunks, 0)
        return [Int4Weight(q, z, s, self.group_size) for q, z, s in zip(qs, zs, ss, strict=True)]

    def split(self, sizes: list[int], dim: int = 0) -> list[Int4Weight]:
        """Outputs in the given counts (phi3's fused q | k | v and gate | up): packed columns."""
        if dim != 0:
            raise Int4LayoutError("an int4 weight splits along its outputs only")
        parts = zip(*(t.split(sizes, 1) for t in (self.qweight, self.zeros, self.scales)), strict=True)
        return [Int4Weight(q, z, s, self.group_size) for q, z, s in parts]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Int4Weight:
        """On device, its scales in dtype (the serving dtype); the packed tensors stay integers."""
        q, z = self.qweight.to(device), self.zeros.to(device)
        return replace(self, qweight=q.contiguous(), zeros=z.contiguous(), scales=self.scales.to(device, dtype))

    def contiguous(self) -> Int4Weight:
        return replace(self, scales=self.scales.contiguous())

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        """torch.cat of int4 weights along outputs (q | k | v, gate | up); nothing else."""
        kwargs = kwargs or {}
        if func is torch.cat and kwargs.get("dim", args[1] if len(args) > 1 else 0) == 0:
            ws = list(args[0])
            if all(isinstance(w, Int4Weight) and w.group_size == ws[0].group_size for w in ws):
                q, z, s = (torch.cat([getattr(w, n) for w in ws], 1) for n in ("qweight", "zeros", "scales"))
                return Int4Weight(q, z, s, ws[0].group_size)
        raise TypeError(f"{getattr(func, '__name__', func)} is not defined for int4 weights (only torch.cat on dim 0)")


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """[R / 8, C] int32, row 8i + j at bits 4j -> [R, C] uint8."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    q = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [R / 8, 8, C]
    return q.reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """[R, C / 8] int32, column 8i + j at bits 4j -> [R, C] uint8."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    return ((packed[:, :, None] >> shifts) & 0xF).reshape(packed.shape[0], -1).to(torch.uint8)


def _to_int32(v: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words held in int64 -> the int32 of the same bits."""
    return (v - ((v >> 31) & 1) * (1 << 32)).to(torch.int32)


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """[R, C] values 0..15 -> [R / 8, C] int32, row 8i + j at bits 4j (unpack_rows' inverse)."""
    v = q.long().view(-1, 8, q.shape[1]) << torch.arange(0, 32, 4, device=q.device)[None, :, None]
    return _to_int32(v.sum(1))


def pack_cols(q: torch.Tensor) -> torch.Tensor:
    """[R, C] values 0..15 -> [R, C / 8] int32, column 8i + j at bits 4j (unpack_cols' inverse)."""
    v = q.long().view(q.shape[0], -1, 8) << torch.arange(0, 32, 4, device=q.device)
    return _to_int32(v.sum(2))


def int4_reference(
    x: torch.Tensor, w: Int4Weight, out: torch.Tensor | None = None, accumulate: bool = False
) -> torch.Tensor:
    """x [T, K] @ W.t() with W dequantized to x's dtype: the CPU path and the kernel's reference."""
    wd = w.dequantize(x.dtype)
    if accumulate:
        assert out is not None, "accumulate needs out"
        return out.addmm_(x, wd.t())
    return x @ wd.t() if out is None else torch.mm(x, wd.t(), out=out)
