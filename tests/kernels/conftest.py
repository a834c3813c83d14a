"""Kernel tests: compiled Triton on CUDA, the Triton interpreter on the CPU.

``triton.jit`` picks the interpreter when the function is decorated, that is when a kernel
module is first imported, so TRITON_INTERPRET must be set here, at conftest import time,
before pytest imports the test modules (which import the kernels).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from services.worker.memory.kv_cache import KV_QUANT_DTYPES, SCALE_DTYPES, quantize_kv, scale_values

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    _early = sorted(m for m in sys.modules if m.startswith("services.worker.kernels."))
    if _early:
        # Some module collected earlier imported the kernels: they were built for a GPU
        # and every launch would fail. Import them lazily there, or set the variable sooner.
        raise RuntimeError(f"kernel modules imported before TRITON_INTERPRET was set: {_early}")


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float32:
        return {"rtol": 1e-4, "atol": 1e-4}
    if dtype == torch.float16:
        return {"rtol": 1e-2, "atol": 1e-2}
    return {"rtol": 2e-2, "atol": 2e-2}


@pytest.fixture
def tol() -> Callable[[torch.dtype], dict[str, float]]:
    """assert_close tolerances by dtype: float32 about 1e-4, float16 1e-2, bfloat16 2e-2."""
    return _tolerance


@pytest.fixture
def device() -> torch.device:
    """Where the small tests run: CUDA when there is one, else the CPU under the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@dataclass
class PooledRequests:
    """Requests whose K/V sit in a token pool at scattered slots, as the worker keeps them."""

    k_pool: torch.Tensor  # [C, Hkv, D], NaN in unused slots (float pools)
    v_pool: torch.Tensor
    k_scale: torch.Tensor | None  # [C, Hkv] float32 for an int8 or e4m3 pool, NaN in unused slots
    v_scale: torch.Tensor | None
    req_table: torch.Tensor  # [rows, max_context] int32
    rows: torch.Tensor  # [B] int32, each request's table row (not its batch index)
    keys: list[torch.Tensor]  # per request [len, Hkv, D]: the pool's values, dequantized
    values: list[torch.Tensor]


def _make_pooled(
    lens: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, quantized: bool | str, device: torch.device
) -> PooledRequests:
    """quantized: False (a float pool), True or "int8", or "fp8" (e4m3)."""
    quant = KV_QUANT_DTYPES["int8" if quantized is True else quantized] if quantized else None
    total = sum(lens)
    capacity = total + 7
    slots = torch.randperm(capacity, device=device)[:total].to(torch.int32)
    max_context = max(lens) + 5
    num_rows = len(lens) + 2
    # unused table entries point at slot capacity - 1, which holds garbage (or NaN)
    table = torch.full((num_rows, max_context), capacity - 1, dtype=torch.int32, device=device)
    rows = torch.randperm(num_rows, device=device)[: len(lens)].to(torch.int32)
    shape = (capacity, kv_heads, head_dim)
    k_scale = v_scale = None
    if quant is not None:
        # garbage in unused slots: any byte but e4m3's NaN (0x7F, 0xFF) decodes to a finite value
        k_pool = torch.randint(0, 127, shape, dtype=torch.uint8, device=device).view(quant)
        v_pool = torch.randint(0, 127, shape, dtype=torch.uint8, device=device).view(quant)
        # and scales that poison what reads them: NaN, or (e4m3's int8 exponents) 2^127
        poison = float("nan") if SCALE_DTYPES[quant].is_floating_point else 127
        k_scale = torch.full(shape[:2], poison, dtype=SCALE_DTYPES[quant], device=device)
        v_scale = torch.full(shape[:2], poison, dtype=SCALE_DTYPES[quant], device=device)
    else:
        k_pool = torch.full(shape, float("nan"), dtype=dtype, device=device)
        v_pool = torch.full(shape, float("nan"), dtype=dtype, device=device)
    keys, values = [], []
    offset = 0
    for row, n in zip(rows.tolist(), lens, strict=True):
        s = slots[offset : offset + n]
        offset += n
        table[row, :n] = s
        idx = s.long()
        k = torch.randn(n, kv_heads, head_dim, device=device).to(dtype)
        v = torch.randn(n, kv_heads, head_dim, device=device).to(dtype)
        if quant is not None:
            assert k_scale is not None and v_scale is not None
            k_pool[idx], k_scale[idx] = quantize_kv(k, quant)
            v_pool[idx], v_scale[idx] = quantize_kv(v, quant)
            # what KVCache.dequantized gives the torch backend
            k = (k_pool[idx].float() * scale_values(k_scale[idx])[..., None]).to(dtype)
            v = (v_pool[idx].float() * scale_values(v_scale[idx])[..., None]).to(dtype)
        else:
            k_pool[idx] = k
            v_pool[idx] = v
        keys.append(k)
        values.append(v)
    return PooledRequests(k_pool, v_pool, k_scale, v_scale, table, rows, keys, values)


@pytest.fixture
def pooled() -> Callable[..., PooledRequests]:
    """make(lens, kv_heads, head_dim, dtype, quantized, device) -> PooledRequests."""
    return _make_pooled


def reference_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    first_pos: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """float32 causal attention of q [n, Hq, D] at positions first_pos.. over keys/values [L, Hkv, D];
    window > 0: a query at p sees keys in (p - window, p]; softcap > 0: scaled scores s become
    softcap * tanh(s / softcap) first (Hugging Face's eager Gemma 2 attention)."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)  # [L, Hq, D]
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    q_pos = torch.arange(first_pos, first_pos + q.shape[0], device=q.device)[:, None]
    k_pos = torch.arange(keys.shape[0], device=q.device)[None, :]
    hidden = k_pos > q_pos
    if window > 0:
        hidden |= k_pos <= q_pos - window
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


@pytest.fixture
def reference() -> Callable[..., torch.Tensor]:
    """reference(q, keys, values, first_pos, scale, window=0, softcap=0.0): float32 causal attention."""
    return reference_attention
