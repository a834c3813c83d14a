"""store_kv and store_kv_quantized (int8 and FP8 pools) against plain indexing, kv_cache.quantize_int8 and
kv_cache.quantize_fp8."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.kv_store import store_kv
from services.worker.kernels.kv_store_quant import store_kv_quantized
from services.worker.memory.kv_cache import quantize_fp8, quantize_int8


def _kv_views(t: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as strided views into a packed qkv tensor with 2 query heads per KV head."""
    hq = 2 * hkv
    qkv = torch.randn(t, (hq + 2 * hkv) * d, dtype=dtype, device=device)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    return k, v


def _check_store(t: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
    capacity = 3 * t + 5
    k, v = _kv_views(t, hkv, d, dtype, device)
    k_pool = torch.full((capacity, hkv, d), float("nan"), dtype=dtype, device=device)
    v_pool = torch.full_like(k_pool, float("nan"))
    slots = torch.randperm(capacity, device=device)[:t].to(torch.int32)
    store_kv(k, v, k_pool, v_pool, slots)
    idx = slots.long()
    assert torch.equal(k_pool[idx], k) and torch.equal(v_pool[idx], v)
    untouched = torch.ones(capacity, dtype=torch.bool, device=device)
    untouched[idx] = False
    assert k_pool[untouched].isnan().all() and v_pool[untouched].isnan().all()


def _check_store_int8(t: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
    capacity = 3 * t + 5
    k, v = _kv_views(t, hkv, d, dtype, device)
    k[0, 0] = 0  # an all-zero head takes the 1e-8 scale floor
    # -128 is never written by the quantizer: it marks slots the kernel did not touch
    k_pool = torch.full((capacity, hkv, d), -128, dtype=torch.int8, device=device)
    v_pool = torch.full_like(k_pool, -128)
    k_scale = torch.full((capacity, hkv), float("nan"), device=device)
    v_scale = torch.full_like(k_scale, float("nan"))
    slots = torch.randperm(capacity, device=device)[:t].to(torch.int32)
    store_kv_quantized(k, v, k_pool, v_pool, k_scale, v_scale, slots)
    idx = slots.long()
    for x, pool, scale in ((k, k_pool, k_scale), (v, v_pool, v_scale)):
        ref_q, ref_s = quantize_int8(x)
        torch.testing.assert_close(scale[idx], ref_s, rtol=1e-6, atol=0)
        diff = (pool[idx].int() - ref_q.int()).abs()
        # identical but for a rare off-by-one where x / scale lands on a tie
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3
        untouched = torch.ones(capacity, dtype=torch.bool, device=device)
        untouched[idx] = False
        assert (pool[untouched] == -128).all() and scale[untouched].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hkv", "d"), [(2, 16), (1, 64), (3, 24)])
def test_store_kv_small(hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
    _check_store(11, hkv, d, dtype, device)


def _check_store_fp8(t: int, hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
    """The stored bytes equal quantize_fp8's exactly: its values (ties, tiny values that round
    to e4m3's subnormals or to -0.0 included) and its scales."""
    capacity = 3 * t + 5
    k, v = _kv_views(t, hkv, d, dtype, device)
    k[0, 0] = 0  # an all-zero head takes the 1e-8 scale floor
    k[1, 0, :4] = torch.tensor([1.0, -1e-5, 0.5 + 1 / 64, -0.0], dtype=dtype)  # a subnormal, a tie, -0.0
    # 0x7F is e4m3's NaN, never written by the quantizer: it marks slots the kernel did not touch
    k_pool = torch.full((capacity, hkv, d), 0x7F, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    v_pool = k_pool.clone()
    # exponents: 127 is more than any float32 absmax / 448 needs, never written by the quantizer either
    k_scale = torch.full((capacity, hkv), 127, dtype=torch.int8, device=device)
    v_scale = k_scale.clone()
    slots = torch.randperm(capacity, device=device)[:t].to(torch.int32)
    store_kv_quantized(k, v, k_pool, v_pool, k_scale, v_scale, slots)
    idx = slots.long()
    for x, pool, scale in ((k, k_pool, k_scale), (v, v_pool, v_scale)):
        ref_q, ref_s = quantize_fp8(x)
        assert torch.equal(scale[idx], ref_s)
        assert torch.equal(pool[idx].view(torch.uint8), ref_q.view(torch.uint8))
        untouched = torch.ones(capacity, dtype=torch.bool, device=device)
        untouched[idx] = False
        assert (pool[untouched].view(torch.uint8) == 0x7F).all() and (scale[untouched] == 127).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hkv", "d"), [(2, 16), (1, 64), (3, 24)])
def test_store_kv_fp8_small(hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
    _check_store_fp8(11, hkv, d, dtype, device)


@pytest.mark.parametrize(
    ("pool_dtype", "scale_dtype", "match"),
    [
        (torch.int8, torch.int8, "scales of a torch.int8 pool must be .* torch.float32"),
        (torch.float8_e4m3fn, torch.float32, "scales of a torch.float8_e4m3fn pool must be .* torch.int8"),
        (torch.float16, torch.float32, "pools must be int8 or float8_e4m3fn"),
    ],
)
def test_store_kv_quantized_refuses_scales_of_the_other_format(pool_dtype, scale_dtype, match, device) -> None:
    k = torch.randn(2, 1, 16, device=device)
    pool = torch.zeros(4, 1, 16, device=device).to(pool_dtype)
    scale = torch.ones(4, 1, device=device).to(scale_dtype)
    with pytest.raises(ValueError, match=match):
        store_kv_quantized(k, k, pool, pool, scale, scale, torch.zeros(2, dtype=torch.int32, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hkv", "d"), [(2, 16), (1, 64), (3, 24)])
def test_store_kv_int8_small(hkv: int, d: int, dtype: torch.dtype, device: torch.device) -> None:
    _check_store_int8(11, hkv, d, dtype, device)


def test_store_kv_rejects_wrong_slots(device: torch.device) -> None:
    k = torch.randn(4, 2, 16, device=device)
    pool = torch.zeros(8, 2, 16, device=device)
    with pytest.raises(ValueError, match="slots"):
        store_kv(k, k, pool, pool, torch.zeros(3, dtype=torch.int32, device=device))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_store_kv_llama3_8b() -> None:
    _check_store(4096, 8, 128, torch.bfloat16, torch.device("cuda"))
    _check_store_int8(4096, 8, 128, torch.bfloat16, torch.device("cuda"))
    _check_store_fp8(4096, 8, 128, torch.bfloat16, torch.device("cuda"))
