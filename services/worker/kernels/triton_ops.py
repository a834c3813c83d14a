"""``LayerOps`` on Triton kernels: the CUDA path of the elementwise and normalisation steps, and
of a mixture of experts' routed experts (bf16 or FP8 weights)."""

from __future__ import annotations

import torch

from services.worker.kernels.add_rmsnorm import add_rmsnorm_
from services.worker.kernels.fused_moe import fused_experts
from services.worker.kernels.gelu_tanh_mul import gelu_tanh_mul
from services.worker.kernels.head_rmsnorm import head_rmsnorm_
from services.worker.kernels.rmsnorm import rmsnorm
from services.worker.kernels.rotary import rotary_
from services.worker.kernels.silu_mul import silu_mul
from services.worker.models.fp8_weight import Fp8ExpertWeight
from services.worker.models.layers.fp8_product import fp8_triton
from services.worker.models.layers.ops import RowNorm
from services.worker.models.weights import ExpertWeight


class TritonOps:
    """One fused kernel per step; same arithmetic as ``services.worker.models.layers.ops.TorchOps``."""

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
        return rmsnorm(x, weight, eps, unit_offset=unit_offset)

    def add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
    ) -> torch.Tensor:
        return add_rmsnorm_(x, residual, weight, eps, unit_offset=unit_offset)

    def head_rmsnorm_(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_weight: torch.Tensor,
        k_weight: torch.Tensor,
        eps: float,
        unit_offset: bool = False,
    ) -> None:
        head_rmsnorm_(q, k, q_weight, k_weight, eps, unit_offset=unit_offset)

    def rotary_(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor) -> None:
        rotary_(q, k, positions, cos_sin)

    def silu_mul(self, gate_up: torch.Tensor, norm: RowNorm | None = None) -> torch.Tensor:
        return silu_mul(gate_up, norm=norm)

    def experts(
        self, x: torch.Tensor, w13: ExpertWeight, w2: ExpertWeight, weights: torch.Tensor, ids: torch.Tensor
    ) -> torch.Tensor:
        if x.device.type == "cuda" and not fp8_triton(x.device):
            # Triton converts e4m3 from compute capability 8.9 on: older GPUs multiply FP8 experts
            # dequantized, a layer's experts at a time (correct, and slower than bf16 weights)
            w13, w2 = (w.dequantize(x.dtype) if isinstance(w, Fp8ExpertWeight) else w for w in (w13, w2))
        return fused_experts(x, w13, w2, weights, ids)

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gelu_tanh_mul(gate_up)
