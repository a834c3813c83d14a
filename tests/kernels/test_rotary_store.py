"""rotary_store_ against TorchOps.rotary_ followed by plain indexing into the pool."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.rotary_store import rotary_store_
from services.worker.models.layers.ops import TorchOps
from services.worker.models.layers.rope import cos_sin_table


def _check(t: int, hq: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    max_pos, capacity = 4096, 3 * t + 5
    cos_sin = cos_sin_table(d, 500000.0, {}, max_pos, device)
    positions = torch.randint(0, max_pos, (t,), dtype=torch.int64, device=device)
    slots = torch.randperm(capacity, device=device)[:t].to(torch.int32)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    ref = qkv.clone()

    def views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = x[:, : hq * d].view(t, hq, d)
        k = x[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
        v = x[:, (hq + hkv) * d :].view(t, hkv, d)
        return q, k, v

    k_pool = torch.full((capacity, hkv, d), float("nan"), dtype=dtype, device=device)
    v_pool = torch.full_like(k_pool, float("nan"))
    q, k, v = views(qkv)
    rotary_store_(q, k, v, positions, cos_sin, k_pool, v_pool, slots)

    rq, rk, _ = views(ref)
    TorchOps().rotary_(rq, rk, positions, cos_sin)
    torch.testing.assert_close(qkv, ref, **tol(dtype))  # q and k rotated in place, v untouched
    assert torch.equal(qkv[:, (hq + hkv) * d :], ref[:, (hq + hkv) * d :])
    idx = slots.long()
    # the pool holds exactly what the kernel left in k (the rotated values) and v
    assert torch.equal(k_pool[idx], k) and torch.equal(v_pool[idx], v)
    untouched = torch.ones(capacity, dtype=torch.bool, device=device)
    untouched[idx] = False
    assert k_pool[untouched].isnan().all() and v_pool[untouched].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 2, 16), (3, 1, 64), (2, 1, 128), (6, 3, 32)])
def test_rotary_store_small(hq: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device, tol) -> None:
    _check(9, hq, hkv, d, dtype, device, tol)


def test_rotary_store_rejects_an_int8_pool(device: torch.device) -> None:
    t, h, d = 2, 2, 16
    cos_sin = cos_sin_table(d, 10000.0, {}, 64, device)
    q, k, v = (torch.randn(t, h, d, device=device) for _ in range(3))
    pool = torch.zeros(8, h, d, dtype=torch.int8, device=device)
    with pytest.raises(ValueError, match="float dtype"):
        rotary_store_(
            q,
            k,
            v,
            torch.arange(t, device=device),
            cos_sin,
            pool,
            pool.clone(),
            torch.arange(t, dtype=torch.int32, device=device),
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rotary_store_llama3_8b(tol) -> None:
    _check(4096, 32, 8, 128, torch.bfloat16, torch.device("cuda"), tol)
