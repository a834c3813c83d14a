"""Token allocator, request table and the KV manager's verbs."""

from __future__ import annotations

import pytest
import torch

from services.worker.memory.kv_cache import (
    KV_QUANT_DTYPES,
    KVCache,
    KVLayout,
    quantize_fp8,
    quantize_int8,
    scale_values,
)
from services.worker.memory.kv_manager import KVManager
from services.worker.memory.req_table import ReqTable
from services.worker.memory.token_allocator import TokenAllocator
from services.worker.request import Req
from tests.worker.engine_driver import request


def test_allocator_hands_out_each_slot_once() -> None:
    alloc = TokenAllocator(10, "cpu")
    a = alloc.allocate(4)
    b = alloc.allocate(6)
    assert sorted(torch.cat([a, b]).tolist()) == list(range(10))
    assert not alloc.can_allocate(1)
    with pytest.raises(MemoryError):
        alloc.allocate(1)
    alloc.free(a)
    c = alloc.allocate(4)
    assert sorted(c.tolist()) == sorted(a.tolist())
    alloc.free(b)
    alloc.free(c)
    with pytest.raises(RuntimeError):
        alloc.free(c)  # a double free would overfill the pool


def test_kv_manager_allocates_rows_and_releases_everything() -> None:
    kv = KVManager(TokenAllocator(16, "cpu"), ReqTable(2, 32, "cpu", dummy_slot=16))
    r1, r2 = Req(request("1", [1, 2, 3]), 1), Req(request("2", [4]), 2)
    s1 = kv.allocate(r1, 3)
    s2 = kv.allocate(r1, 2)
    assert r1.row is not None and r1.alloc_len == 5
    assert kv.table.slots(r1.row, 5).tolist() == s1.tolist() + s2.tolist()
    kv.allocate(r2, 1)
    assert not kv.can_allocate(1, new_rows=1)  # two rows, both taken
    assert kv.free_tokens == 10
    kv.release(r1)
    kv.release(r2)
    assert kv.free_tokens == 16 and kv.table.num_free_rows == 2 and r1.row is None


def test_a_decode_steps_slots_are_left_for_the_batch_to_record() -> None:
    """allocate_one_each hands out one slot a request and leaves the table as it was (the step's
    batch records them); a request whose slots do not match its tokens is refused."""
    kv = KVManager(TokenAllocator(16, "cpu"), ReqTable(2, 32, "cpu", dummy_slot=16))
    r1, r2 = Req(request("1", [1, 2, 3]), 1), Req(request("2", [4]), 2)
    for r, n in ((r1, 3), (r2, 1)):
        kv.allocate(r, n)
        r.kv_len = n
    before = kv.table.table.clone()
    slots = kv.allocate_one_each([r1, r2])
    assert slots.shape == (2,) and kv.free_tokens == 10
    assert (r1.alloc_len, r2.alloc_len) == (4, 2)
    assert torch.equal(kv.table.table, before)
    with pytest.raises(RuntimeError, match="2 slots for 1 tokens"):
        kv.allocate_one_each([r2])  # its kv_len was not advanced: the step before never launched
    assert kv.free_tokens == 10  # nothing taken by the refused call


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_quantized_layout_holds_about_twice_the_tokens(kv: str) -> None:
    bf16 = KVLayout(32, 8, 128, torch.bfloat16, quantized=False)
    quant = KVLayout(32, 8, 128, torch.bfloat16, quantized=True, quant_dtype=KV_QUANT_DTYPES[kv])
    assert bf16.bytes_per_token / quant.bytes_per_token >= 1.9
    cache = KVCache(quant, 16, "cpu")
    assert cache.k[0].dtype == cache.v[0].dtype == KV_QUANT_DTYPES[kv] and cache.k[0].element_size() == 1


def test_fp8_quantization_round_trips_within_e4m3s_step() -> None:
    """e4m3 keeps 3 mantissa bits: each value within 1/16 of its own magnitude (relative), or half
    the smallest subnormal step of its head's scale. The scale is a power of two, an int8 exponent."""
    x = torch.randn(64, 4, 32) * torch.logspace(-6, 6, 64)[:, None, None]
    x[0, 0] = 0.0  # an all-zero head: the 1e-8 floor
    q, e = quantize_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and e.shape == (64, 4) and e.dtype == torch.int8
    top = q.float().abs().amax(-1)[1:]
    assert (top >= 224).all() and (top <= 448).all()  # each head's absmax lands in (224, 448], rounded
    cache = KVCache(KVLayout(1, 4, 32, torch.float32, quantized=True, quant_dtype=torch.float8_e4m3fn), 64, "cpu")
    assert cache.k_scale[0].dtype == torch.int8 and bool((cache.k_scale[0] == 0).all())  # 2^0 until written
    slots = torch.arange(64)
    cache.k[0][slots], cache.k_scale[0][slots] = q, e
    cache.v[0][slots], cache.v_scale[0][slots] = q, e
    k, _ = cache.dequantized(0, slots)
    bound = x.abs() / 16 + scale_values(e)[..., None] * 2.0**-10
    assert ((k - x).abs() <= bound).all()


def test_fp8_scales_cost_a_byte_a_head() -> None:
    """Head dim 64: bf16 128 bytes a head a token, e4m3 64 + 1 (int8 KV: 64 + a float32 scale)."""
    layout = {
        kv: KVLayout(16, 8, 64, torch.bfloat16, quantized=True, quant_dtype=KV_QUANT_DTYPES[kv])
        for kv in KV_QUANT_DTYPES
    }
    bf16 = KVLayout(16, 8, 64, torch.bfloat16, quantized=False)
    assert bf16.bytes_per_token / layout["fp8"].bytes_per_token == 128 / 65
    assert bf16.bytes_per_token / layout["int8"].bytes_per_token == 128 / 68


def test_int8_quantization_round_trips_closely() -> None:
    x = torch.randn(64, 4, 32)
    q, scale = quantize_int8(x)
    assert q.dtype == torch.int8 and scale.shape == (64, 4)
    cache = KVCache(KVLayout(1, 4, 32, torch.float32, quantized=True), 64, "cpu")
    slots = torch.arange(64)
    cache.k[0][slots], cache.k_scale[0][slots] = q, scale
    cache.v[0][slots], cache.v_scale[0][slots] = q, scale
    k, _ = cache.dequantized(0, slots)
    assert float((k - x).abs().max()) <= float(scale.max()) / 2 + 1e-6
