"""extend_attention (causal prefill over prefix-in-pool + new tokens) against float32 attention."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.extend_attention import extend_attention


def _check(
    ext_lens: list[int],
    prefix_lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    quantized: bool | str,
    device: torch.device,
    pooled,
    reference,
    tol,
    window: int = 0,
    softcap: float = 0.0,
    **config: int,
) -> None:
    req = pooled([max(p, 1) for p in prefix_lens], hkv, d, dtype, quantized, device)
    e = sum(ext_lens)
    # q, k_new, v_new are strided views into one packed qkv tensor, as the model makes them
    qkv = torch.randn(e, hq + 2 * hkv, d, device=device).to(dtype)
    q, k_new, v_new = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    starts = torch.tensor([sum(ext_lens[:i]) for i in range(len(ext_lens))], dtype=torch.int32, device=device)
    as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)
    out = torch.full((e, hq, d), float("nan"), dtype=dtype, device=device)
    scale = d**-0.5
    extend_attention(
        q,
        k_new,
        v_new,
        req.k_pool,
        req.v_pool,
        req.req_table,
        req.rows,
        starts,
        as_int32(ext_lens),
        as_int32(prefix_lens),
        max(ext_lens),
        scale,
        out=out,
        k_scale=req.k_scale,
        v_scale=req.v_scale,
        window=window,
        softcap=softcap,
        **config,
    )
    for i, (n, p) in enumerate(zip(ext_lens, prefix_lens, strict=True)):
        s = int(starts[i])
        keys = torch.cat([req.keys[i][:p], k_new[s : s + n]])
        values = torch.cat([req.values[i][:p], v_new[s : s + n]])
        ref = reference(q[s : s + n], keys, values, p, scale, window, softcap)
        torch.testing.assert_close(out[s : s + n], ref.to(dtype), **tol(dtype))


# segments shorter than, equal to and longer than the CPU tiles (32 x 16), with and without prefix
EXT = [45, 1, 16, 33]
PREFIX = [0, 19, 31, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 2, 32), (2, 1, 24), (2, 1, 64), (2, 1, 128)])
def test_extend_small(hq: int, hkv: int, d: int, dtype: torch.dtype, device, pooled, reference, tol) -> None:
    _check(EXT, PREFIX, hq, hkv, d, dtype, False, device, pooled, reference, tol)


@pytest.mark.parametrize("kv", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_small_quantized_prefix(kv: str, dtype: torch.dtype, device, pooled, reference, tol) -> None:
    _check(EXT, PREFIX, 4, 2, 32, dtype, kv, device, pooled, reference, tol)


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 16), (64, 32)])
def test_extend_block_overrides(block_m: int, block_n: int, device, pooled, reference, tol) -> None:
    _check(
        EXT, PREFIX, 2, 2, 16, torch.float32, False, device, pooled, reference, tol, BLOCK_M=block_m, BLOCK_N=block_n
    )


# windows of one token, shorter than a tile, a few tiles long, longer than every context; with a
# soft cap these random scores (of order one) run into, and without
@pytest.mark.parametrize("window", [1, 7, 20, 40, 4096])
@pytest.mark.parametrize("softcap", [0.0, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_sliding_window_and_softcap(
    window: int, softcap: float, dtype: torch.dtype, device, pooled, reference, tol
) -> None:
    _check(EXT, PREFIX, 4, 2, 32, dtype, False, device, pooled, reference, tol, window, softcap)


@pytest.mark.parametrize("quantized", [False, True])
def test_extend_softcap_alone_and_with_an_int8_prefix(quantized: bool, device, pooled, reference, tol) -> None:
    _check(EXT, PREFIX, 4, 2, 32, torch.float32, quantized, device, pooled, reference, tol, 9, 5.0)
    _check(EXT, PREFIX, 2, 1, 64, torch.float32, quantized, device, pooled, reference, tol, 0, 1.0)


def test_extend_window_over_small_blocks(device, pooled, reference, tol) -> None:
    """A window that starts mid-prefix for some query blocks and mid-segment for others."""
    _check(
        [70, 3], [50, 40], 2, 2, 16, torch.float32, False, device, pooled, reference, tol, 23, BLOCK_M=16, BLOCK_N=16
    )


def test_extend_rejects_a_bad_window(device) -> None:
    q = torch.randn(4, 2, 16, device=device)
    ints = torch.zeros(1, dtype=torch.int32, device=device)
    table = torch.zeros(2, 8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="window"):
        extend_attention(q, q, q, q, q, table, ints, ints, ints + 4, ints, 4, 1.0, window=-1)


def test_extend_rejects_bad_blocks(device) -> None:
    q = torch.randn(4, 2, 16, device=device)
    ints = torch.zeros(1, dtype=torch.int32, device=device)
    table = torch.zeros(2, 8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="multiple"):
        extend_attention(q, q, q, q, q, table, ints, ints, ints + 4, ints, 4, 1.0, BLOCK_M=32, BLOCK_N=64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("prefix", "quantized"), [(0, False), (2048, False), (2048, True), (2048, "fp8")])
def test_extend_llama3_8b(prefix: int, quantized: bool, pooled, reference, tol) -> None:
    _check([4096], [prefix], 32, 8, 128, torch.bfloat16, quantized, torch.device("cuda"), pooled, reference, tol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_extend_mixed_segments_gpu(pooled, reference, tol) -> None:
    _check(
        [700, 1, 129, 64],
        [0, 300, 5, 1000],
        32,
        8,
        128,
        torch.bfloat16,
        False,
        torch.device("cuda"),
        pooled,
        reference,
        tol,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quantized", [False, True])
def test_extend_gemma2_9b_window_and_softcap(quantized: bool, pooled, reference, tol) -> None:
    """Gemma 2 9B's heads (256 wide) with its 4096-token window and soft cap 50: a prompt whose
    window starts inside its prefix, one past it, one shorter than the window."""
    _check(
        [3000, 700, 64],
        [3000, 6000, 0],
        16,
        8,
        256,
        torch.bfloat16,
        quantized,
        torch.device("cuda"),
        pooled,
        reference,
        tol,
        4096,
        50.0,
    )
