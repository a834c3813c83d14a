"""TritonAttention against TorchAttention on a mixed step: extends with prefixes, then decodes."""

from __future__ import annotations

import pytest
import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.kernels.triton_ops import TritonOps
from services.worker.memory.kv_cache import KVCache, KVLayout
from services.worker.models.attention.base import LayerAttention
from services.worker.models.attention.torch_backend import TorchAttention
from services.worker.models.attention.triton_backend import TritonAttention
from services.worker.models.layers.ops import RowNorm, TorchOps
from services.worker.models.layers.rope import cos_sin_table

LAYER = 1


def _random_cache(layout: KVLayout, capacity: int, device: torch.device) -> KVCache:
    cache = KVCache(layout, capacity, device)
    for layer in range(layout.num_layers):
        for pool in (cache.k[layer], cache.v[layer]):
            if layout.quantized:
                pool.copy_(torch.randint(-127, 128, pool.shape, dtype=torch.int8, device=device))
            else:
                pool.copy_(torch.randn(pool.shape, device=device))
        if layout.quantized:
            assert cache.k_scale is not None and cache.v_scale is not None
            cache.k_scale[layer].uniform_(0.005, 0.02)
            cache.v_scale[layer].uniform_(0.005, 0.02)
    return cache


def _copy_cache(src: KVCache) -> KVCache:
    dst = KVCache(src.layout, src.capacity, src.k[0].device)
    for a, b in zip(
        dst.k + dst.v + (dst.k_scale or []) + (dst.v_scale or []),
        src.k + src.v + (src.k_scale or []) + (src.v_scale or []),
        strict=True,
    ):
        a.copy_(b)
    return dst


def _mixed_batch(
    extends: list[tuple[int, int]], decode_lens: list[int], capacity: int, device: torch.device
) -> ForwardBatch:
    """extends: (prefix_len, new tokens) per segment; decode_lens: context including the new token."""
    num_reqs = len(extends) + len(decode_lens)
    max_context = max([p + n for p, n in extends] + decode_lens) + 3
    table = torch.full((num_reqs + 1, max_context), capacity, dtype=torch.int32, device=device)
    rows = torch.randperm(num_reqs, device=device).tolist()
    free = torch.randperm(capacity, device=device).to(torch.int32)
    used = 0
    out_slots = []
    for row, total, new in zip(
        rows, [p + n for p, n in extends] + decode_lens, [n for _, n in extends] + [1] * len(decode_lens), strict=True
    ):
        table[row, :total] = free[used : used + total]
        used += total
        out_slots.append(table[row, total - new : total])
    ext_lens = [n for _, n in extends]
    starts = [sum(ext_lens[:i]) for i in range(len(extends))]
    t = sum(ext_lens) + len(decode_lens)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)
    return ForwardBatch(
        input_ids=torch.zeros(t, dtype=torch.int64, device=device),
        positions=torch.zeros(t, dtype=torch.int64, device=device),
        out_slots=torch.cat(out_slots),
        req_table=table,
        num_extend_tokens=sum(ext_lens),
        extend_rows=i32(rows[: len(extends)]),
        extend_starts=i32(starts),
        extend_lens=i32(ext_lens),
        extend_prefix_lens=i32([p for p, _ in extends]),
        extend_max_len=max(ext_lens, default=0),
        extend_lens_host=ext_lens,
        extend_prefix_lens_host=[p for p, _ in extends],
        decode_rows=i32(rows[len(extends) :]),
        decode_seq_lens=i32(decode_lens),
        decode_max_len=max(decode_lens, default=0),
        sample_index=torch.zeros(0, dtype=torch.int64, device=device),
    )


def _check(
    extends: list[tuple[int, int]],
    decode_lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    quantized: bool,
    device: torch.device,
    tol,
    reference,
    how: LayerAttention | None = None,
) -> None:
    """how: layer LAYER's attention settings (None: the default's, causal, scaled by d^-1/2)."""
    how = how or LayerAttention(d**-0.5)
    layers = (LayerAttention(d**-0.5), how)
    layout = KVLayout(num_layers=2, kv_heads=hkv, head_dim=d, dtype=dtype, quantized=quantized)
    capacity = sum(p + n for p, n in extends) + sum(decode_lens) + 11
    torch_cache = _random_cache(layout, capacity, device)
    triton_cache = _copy_cache(torch_cache)
    batch = _mixed_batch(extends, decode_lens, capacity, device)
    qkv = torch.randn(batch.num_tokens, hq + 2 * hkv, d, device=device).to(dtype)
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]  # strided views, as the model makes them
    ref = TorchAttention(torch_cache, hq, d, layers).forward(LAYER, q, k, v, batch)
    triton = TritonAttention(triton_cache, hq, d, max_decode_batch=len(decode_lens), layers=layers)
    out = triton.forward(LAYER, q, k, v, batch)
    e = batch.num_extend_tokens
    if not quantized:
        torch.testing.assert_close(out, ref, **tol(dtype))
    else:
        # TorchAttention reads this step's extend tokens back from the int8 pool; the Triton
        # extend uses them as computed. Decodes read the pool in both.
        torch.testing.assert_close(out[e:], ref[e:], **tol(dtype))
        torch.testing.assert_close(out[:e], ref[:e], rtol=0.1, atol=0.05)  # int8 rounding noise only
        for i, (p, n) in enumerate(extends):
            s, row = int(batch.extend_starts[i]), int(batch.extend_rows[i])
            keys, values = torch_cache.dequantized(LAYER, batch.req_table[row, :p].long())
            keys, values = torch.cat([keys, k[s : s + n]]), torch.cat([values, v[s : s + n]])
            want = reference(q[s : s + n], keys, values, p, how.scale, how.window, how.softcap).to(dtype)
            torch.testing.assert_close(out[s : s + n], want, **tol(dtype))
    for name in ("k", "v"):
        got, want = getattr(triton_cache, name)[LAYER], getattr(torch_cache, name)[LAYER]
        if quantized:  # stored values agree but for a rare off-by-one on rounding ties
            assert (got.int() - want.int()).abs().max() <= 1
            scales = getattr(triton_cache, f"{name}_scale"), getattr(torch_cache, f"{name}_scale")
            torch.testing.assert_close(scales[0][LAYER], scales[1][LAYER], rtol=1e-6, atol=0)
        else:
            assert torch.equal(got, want)


EXTENDS = [(0, 37), (12, 5), (40, 1), (3, 20)]
DECODES = [1, 18, 50, 33, 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("quantized", [False, True])
def test_mixed_batch_small(dtype: torch.dtype, quantized: bool, device, tol, reference) -> None:
    _check(EXTENDS, DECODES, 4, 2, 32, dtype, quantized, device, tol, reference)


@pytest.mark.parametrize(("extends", "decodes"), [(EXTENDS, []), ([], DECODES)])
def test_extends_only_and_decodes_only(
    extends: list[tuple[int, int]], decodes: list[int], device, tol, reference
) -> None:
    _check(extends, decodes, 4, 1, 16, torch.float32, False, device, tol, reference)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize(("window", "softcap"), [(6, 0.0), (0, 2.0), (19, 3.0)])
def test_mixed_batch_with_a_window_and_a_softcap(
    quantized: bool, window: int, softcap: float, device, tol, reference
) -> None:
    """A layer's own scale, sliding window and soft cap (Gemma's), the same on both backends."""
    how = LayerAttention(0.3, window, softcap)
    _check(EXTENDS, DECODES, 4, 2, 32, torch.float32, quantized, device, tol, reference, how)


def test_settings_must_cover_every_layer(device) -> None:
    cache = KVCache(KVLayout(num_layers=2, kv_heads=1, head_dim=16, dtype=torch.float32, quantized=False), 8, device)
    with pytest.raises(ValueError, match="1 layers' attention settings for a pool of 2"):
        TorchAttention(cache, 2, 16, [LayerAttention(0.25)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quantized", [False, True])
def test_mixed_batch_llama3_8b(quantized: bool, tol, reference) -> None:
    extends = [(0, 1000), (700, 300), (2000, 1), (50, 129)]
    decodes = [int(x) for x in torch.randint(1, 2048, (64,))]
    _check(extends, decodes, 32, 8, 128, torch.bfloat16, quantized, torch.device("cuda"), tol, reference)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize(("folded", "how"), [(False, None), (True, None), (False, LayerAttention(0.2, 9, 2.5))])
def test_decode_attend_rotates_stores_and_attends(
    dtype: torch.dtype, quantized: bool, folded: bool, how: LayerAttention | None, device, tol
) -> None:
    """A decode-only step's q, k and v as projected: the Triton backend's kernel rotates, stores
    and attends at once (an int8 pool: rotary_store, then attend), as the base class's two steps
    do on the torch backend. folded: the layer's norm folded into the QKV weights, its factor
    applied to q, k and v first (in the kernel; an int8 pool: by the base class). how: the
    layer's own scale, window and soft cap (Gemma's)."""
    hq, hkv, d = 4, 2, 32
    layers = None if how is None else (LayerAttention(d**-0.5), how)
    layout = KVLayout(num_layers=2, kv_heads=hkv, head_dim=d, dtype=dtype, quantized=quantized)
    capacity = sum(DECODES) + 11
    torch_cache = _random_cache(layout, capacity, device)
    triton_cache = _copy_cache(torch_cache)
    batch = _mixed_batch([], DECODES, capacity, device)
    batch.positions.copy_(batch.decode_seq_lens - 1)
    cos_sin = cos_sin_table(d, 500000.0, {}, max(DECODES), device)
    qkv = torch.randn(batch.num_tokens, hq + 2 * hkv, d, device=device).to(dtype)
    ref_qkv = qkv.clone()
    residual = (torch.randn(batch.num_tokens, 48, device=device) * 3).to(dtype)
    norm = RowNorm(residual, 1e-5) if folded else None

    def views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x[:, :hq], x[:, hq : hq + hkv], x[:, hq + hkv :]

    ref = TorchAttention(torch_cache, hq, d, layers).decode_attend(
        LAYER, *views(ref_qkv), batch, cos_sin, TorchOps().rotary_, norm=norm
    )
    out = TritonAttention(triton_cache, hq, d, max_decode_batch=len(DECODES), layers=layers).decode_attend(
        LAYER, *views(qkv), batch, cos_sin, TritonOps().rotary_, norm=norm
    )
    torch.testing.assert_close(out, ref, **tol(dtype))
    slots = batch.out_slots.long()
    for name in ("k", "v"):
        got, want = getattr(triton_cache, name)[LAYER], getattr(torch_cache, name)[LAYER]
        if quantized:  # stored values agree but for a rare off-by-one on rounding ties
            assert (got.int() - want.int()).abs().max() <= 1
        else:
            torch.testing.assert_close(got[slots], want[slots], **tol(dtype))
            keep = torch.ones(got.shape[0], dtype=torch.bool, device=device)
            keep[slots] = False
            assert torch.equal(got[keep], want[keep])  # nothing else in the pool changed
