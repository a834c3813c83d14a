"""gelu_tanh_mul kernel against TorchOps, and TorchOps against Hugging Face's Gemma MLP activation."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.gelu_tanh_mul import gelu_tanh_mul
from services.worker.models.layers.ops import TorchOps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("t", "inter"), [(1, 16), (5, 200), (3, 2500)])
def test_gelu_tanh_mul_small(t: int, inter: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    gate_up = 3 * torch.randn(t, 2 * inter, dtype=dtype, device=device)
    out = torch.full((t, inter), float("nan"), dtype=dtype, device=device)
    gelu_tanh_mul(gate_up, out=out)
    torch.testing.assert_close(out, TorchOps().gelu_tanh_mul(gate_up), **tol(dtype))


def test_gelu_tanh_mul_of_a_strided_view(device: torch.device, tol) -> None:
    wide = torch.randn(4, 80, device=device)
    gate_up = wide[:, :64]  # rows 80 apart
    torch.testing.assert_close(gelu_tanh_mul(gate_up), TorchOps().gelu_tanh_mul(gate_up), **tol(torch.float32))


def test_torch_ops_is_the_gemma_mlp_activation() -> None:
    from transformers.activations import ACT2FN

    gate_up = (2 * torch.randn(6, 64)).to(torch.bfloat16)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(TorchOps().gelu_tanh_mul(gate_up), ACT2FN["gelu_pytorch_tanh"](gate) * up)


def test_gelu_tanh_mul_rejects_an_odd_width(device: torch.device) -> None:
    with pytest.raises(ValueError, match="2I"):
        gelu_tanh_mul(torch.randn(2, 7, device=device))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gelu_tanh_mul_gemma2_9b(tol) -> None:
    gate_up = 3 * torch.randn(512, 2 * 14336, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(gelu_tanh_mul(gate_up), TorchOps().gelu_tanh_mul(gate_up), **tol(torch.bfloat16))
