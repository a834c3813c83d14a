"""The rotary kernels (rotary_, rotary_store_) turning q and k by M-RoPE: three positions a token,
given as the step's gathered rows (models/layers/mrope.py) at index t for token t, against M-RoPE
written out (Hugging Face's formula: each frequency section's angle from its own position)."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.rotary import rotary_
from services.worker.kernels.rotary_store import rotary_store_
from services.worker.models.layers.mrope import mrope_cos_sin, section_streams
from services.worker.models.layers.rope import cos_sin_table

SECTION = (4, 6, 6)  # Qwen2-VL-7B's [16, 24, 24], shrunk to head_dim 32
THETA = 1000000.0


def _mrope_reference(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] turned by M-RoPE at positions [3, T], in float32, rounded to x's dtype once
    (cos and sin first rounded to x's dtype, as the kernels and Hugging Face do)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)).to(x.device)
    freqs = positions[..., None].float() * inv_freq  # [3, T, D / 2]
    parts = freqs.split(list(SECTION), dim=-1)
    angles = torch.cat([p[i] for i, p in enumerate(parts)], dim=-1)  # [T, D / 2]
    emb = torch.cat([angles, angles], dim=-1)[:, None]
    cos, sin = emb.cos().to(x.dtype).float(), emb.sin().to(x.dtype).float()
    xf = x.float()
    rotated = torch.cat([-xf[..., d // 2 :], xf[..., : d // 2]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def _case(t: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [3, T] (an image's grid among text) and the step's rows [T, D]."""
    positions = torch.stack([torch.arange(t), torch.arange(t) // 3, torch.arange(t) % 3 + 5]).to(device)
    table = cos_sin_table(2 * sum(SECTION), THETA, {}, 64, device)
    return positions, mrope_cos_sin(table, positions, section_streams(SECTION, device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_turns_by_three_positions(dtype: torch.dtype, device: torch.device, tol) -> None:
    t, hq, hkv, d = 7, 4, 2, 2 * sum(SECTION)
    positions, rows = _case(t, device)
    q = torch.randn(t, hq, d, dtype=dtype, device=device)
    k = torch.randn(t, hkv, d, dtype=dtype, device=device)
    want_q, want_k = _mrope_reference(q, positions), _mrope_reference(k, positions)
    rotary_(q, k, torch.arange(t, device=device), rows)
    torch.testing.assert_close(q, want_q, **tol(dtype))
    torch.testing.assert_close(k, want_k, **tol(dtype))


def test_rotary_store_turns_by_three_positions(device: torch.device, tol) -> None:
    t, h, d = 6, 2, 2 * sum(SECTION)
    positions, rows = _case(t, device)
    q, k, v = (torch.randn(t, h, d, device=device) for _ in range(3))
    want_k = _mrope_reference(k, positions)
    k_pool = torch.zeros(2 * t, h, d, device=device)
    v_pool = torch.zeros_like(k_pool)
    slots = torch.arange(t, 2 * t, dtype=torch.int32, device=device)
    rotary_store_(q, k, v, torch.arange(t, device=device), rows, k_pool, v_pool, slots)
    torch.testing.assert_close(k_pool[t:], want_k, **tol(torch.float32))
    assert torch.equal(v_pool[t:], v)
