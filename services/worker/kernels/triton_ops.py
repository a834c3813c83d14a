"""``LayerOps`` on Triton kernels: the CUDA path of the elementwise and normalisation steps, and
of a mixture of experts' routed experts (bf16 or FP8 weights)."""

from __future__ import annotations

import torch

from services.worker.kernels.add_rmsnorm import add_rmsnorm_
from services.worker.kernels.fp8_quant_rows import ONE_PASS_MAX, Fp8Rows, with_rows
from services.worker.kernels.fused_moe import fused_experts
from services.worker.kernels.gelu_tanh_mul import gelu_tanh_mul
from services.worker.kernels.head_rmsnorm import head_rmsnorm_
from services.worker.kernels.rmsnorm import rmsnorm
from services.worker.kernels.rotary import rotary_
from services.worker.kernels.silu_mul import silu_mul
from services.worker.models.fp8_weight import Fp8ExpertWeight
from services.worker.models.layers.fp8_product import fp8_triton, quantizes_rows
from services.worker.models.layers.ops import RowNorm
from services.worker.models.weights import ExpertWeight

# with FP8 products (TritonOps(fp8_rows=True)), the norms and silu_mul store their output's e4m3
# rows beside it where every FP8 product quantizes x per token (quantizes_rows), and the product
# takes them (kernels/fp8_quant_rows.attached_rows) instead of launching fp8_quant_rows. False:
# each product quantizes its own x, as before.
FUSED_ROWS = True


class TritonOps:
    """One fused kernel per step; same arithmetic as ``services.worker.models.layers.ops.TorchOps``.
    fp8_rows: the model's products are FP8 (their x quantized per token past TRITON_MAX_M rows)."""

    def __init__(self, fp8_rows: bool = False) -> None:
        self.fp8_rows = fp8_rows

    def _rows(self, t: int, k: int, device: torch.device) -> Fp8Rows | None:
        """Where an output of t rows of k values stores its e4m3 rows, or None: none wanted."""
        if not (self.fp8_rows and FUSED_ROWS and quantizes_rows(t)) or k > ONE_PASS_MAX:
            return None
        return Fp8Rows.empty(t, k, device)

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False) -> torch.Tensor:
        rows = self._rows(*x.shape, x.device)
        return with_rows(rmsnorm(x, weight, eps, unit_offset=unit_offset, rows=rows), rows)

    def add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
    ) -> torch.Tensor:
        rows = self._rows(*x.shape, x.device)
        return with_rows(add_rmsnorm_(x, residual, weight, eps, unit_offset=unit_offset, rows=rows), rows)

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
        rows = self._rows(gate_up.shape[0], gate_up.shape[1] // 2, gate_up.device)
        return with_rows(silu_mul(gate_up, norm=norm, rows=rows), rows)

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
