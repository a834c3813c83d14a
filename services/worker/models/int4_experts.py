"""One projection of every routed expert of a mixture of experts, in AWQ's or GPTQ's int4
(models/int4_weight.py's layout, an expert axis in front):

    qweight [E, K / 8, N] int32: expert e's packed rows as Int4Weight's
    zeros   [E, K / G, N] uint8
    scales  [E, K / G, N]        in the serving dtype
    W[e, n, k] = (q[e, k, n] - zeros[e, k // G, n]) * scales[e, k // G, n]

moe.load_experts fills it one expert's Int4Weight at a time (``place``; gate's columns, then
up's, as w13 holds them); the grouped GEMM (kernels/fused_moe.py, INT4) reads it as it lies, a
tile dequantized in registers, and the reference (layers/moe.py) dequantizes each chosen expert.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.models.int4_weight import Int4LayoutError, Int4Weight


@dataclass
class Int4ExpertWeight:
    qweight: torch.Tensor  # [E, K / 8, N] int32
    zeros: torch.Tensor  # [E, K / G, N] uint8
    scales: torch.Tensor  # [E, K / G, N]
    group_size: int

    def __post_init__(self) -> None:
        if self.qweight.dim() != 3 or self.zeros.dim() != 3 or self.scales.dim() != 3:
            raise Int4LayoutError(
                f"int4 experts: qweight, zeros and scales must be [E, rows, N], got {tuple(self.qweight.shape)}, "
                f"{tuple(self.zeros.shape)}, {tuple(self.scales.shape)}"
            )
        if self.qweight.shape[0] != self.zeros.shape[0] or self.qweight.shape[0] != self.scales.shape[0]:
            raise Int4LayoutError("int4 experts: qweight, zeros and scales must hold as many experts")
        if self.qweight.shape[0]:  # one expert's layout checked as an Int4Weight's (dtypes, groups)
            Int4Weight(self.qweight[0], self.zeros[0], self.scales[0], self.group_size)

    @classmethod
    def empty(
        cls, experts: int, n: int, k: int, group_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> Int4ExpertWeight:
        """Room for experts' [n, k] weights, filled one expert at a time (moe.load_experts)."""
        if k % 8 or k % group_size:
            raise Int4LayoutError(f"int4 experts of {k} inputs: a multiple of 8 and of the group size {group_size}")
        return cls(
            torch.empty(experts, k // 8, n, dtype=torch.int32, device=device),
            torch.empty(experts, k // group_size, n, dtype=torch.uint8, device=device),
            torch.empty(experts, k // group_size, n, dtype=dtype, device=device),
            group_size,
        )

    @property
    def shape(self) -> torch.Size:
        """The dequantized weights' shape, [E, N, K], as a tensor of experts'."""
        e, k8, n = self.qweight.shape
        return torch.Size((e, n, k8 * 8))

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def dim(self) -> int:
        return 3

    def __getitem__(self, e: int) -> Int4Weight:
        """Expert e's projection."""
        return Int4Weight(self.qweight[e], self.zeros[e], self.scales[e], self.group_size)

    def is_contiguous(self) -> bool:
        return all(t.is_contiguous() for t in (self.qweight, self.zeros, self.scales))

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """-> W [E, N, K] in dtype (the scales' by default), each expert as Int4Weight.dequantize."""
        return torch.stack([self[e].dequantize(dtype) for e in range(self.shape[0])])

    def place(self, e: int, start: int, w: Int4Weight) -> None:
        """Expert e's outputs start .. start + w's set to w's (packed columns, zeros and scales)."""
        if w.group_size != self.group_size or w.shape[1] != self.shape[2]:
            raise Int4LayoutError(
                f"expert {e}: an int4 weight of {w.shape[1]} inputs, group size {w.group_size}, where the "
                f"experts have {self.shape[2]} inputs, group size {self.group_size}"
            )
        cols = slice(start, start + w.shape[0])
        self.qweight[e, :, cols].copy_(w.qweight)
        self.zeros[e, :, cols].copy_(w.zeros)
        self.scales[e, :, cols].copy_(w.scales)
