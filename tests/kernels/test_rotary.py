"""rotary_ kernel against TorchOps.rotary_, on strided views into a packed qkv tensor."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.rotary import rotary_
from services.worker.models.layers.ops import TorchOps
from services.worker.models.layers.rope import cos_sin_table


def _check(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    max_pos = 4096
    cos_sin = cos_sin_table(d, 500000.0, {}, max_pos, device)
    positions = torch.randint(0, max_pos, (t,), dtype=torch.int64, device=device)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    ref = qkv.clone()

    def views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = x[:, : hq * d].view(t, hq, d)
        k = x[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        return q, k

    rotary_(*views(qkv), positions, cos_sin)
    TorchOps().rotary_(*views(ref), positions, cos_sin)
    torch.testing.assert_close(qkv, ref, **tol(dtype))
    # v, the last part of each row, is not touched
    assert torch.equal(qkv[:, (hq + hkv) * d :], ref[:, (hq + hkv) * d :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 2, 16), (2, 2, 32), (3, 1, 64), (2, 1, 128)])
def test_rotary_small(hq: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    _check(9, hq, hkv, d, dtype, device, tol)


def test_rotary_int32_positions(device: torch.device, tol) -> None:
    t, h, d = 4, 2, 32
    cos_sin = cos_sin_table(d, 10000.0, {}, 64, device)
    q = torch.randn(t, h, d, device=device)
    k = torch.randn(t, h, d, device=device)
    ref_q, ref_k = q.clone(), k.clone()
    positions = torch.tensor([0, 5, 63, 1], device=device)
    rotary_(q, k, positions.to(torch.int32), cos_sin)
    TorchOps().rotary_(ref_q, ref_k, positions, cos_sin)
    torch.testing.assert_close(q, ref_q, **tol(torch.float32))
    torch.testing.assert_close(k, ref_k, **tol(torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rotary_llama3_8b(tol) -> None:
    _check(4096, 32, 8, 128, torch.bfloat16, torch.device("cuda"), tol)
