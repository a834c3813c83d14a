"""decode_attention (split-K flash-decoding over the token pool) against float32 attention."""

from __future__ import annotations

import pytest
import torch
import triton

from services.worker.kernels import decode_attention as decode_attention_module
from services.worker.kernels.decode_attention import (
    SPLIT_TOKENS,
    NewTokens,
    choose_num_splits,
    decode_attention,
    decode_config,
    decode_scratch,
)
from services.worker.kernels.launch import Launcher
from services.worker.models.layers.ops import RowNorm
from services.worker.models.layers.rope import cos_sin_table
from tests.kernels.decode_check import check

# lengths around the CPU tile (16): a single token, a partial tile, several tiles
LENS = [1, 17, 70, 33, 5]


# each head shape in one dtype (the first in both), each with every split mode: every dtype meets
# every mode and several shapes (the interpreter's time, not coverage, rules out the whole product)
@pytest.mark.parametrize(
    ("hq", "hkv", "d", "dtype"),
    [
        (4, 2, 32, torch.float32),
        (4, 2, 32, torch.float16),
        (4, 1, 16, torch.float16),
        (2, 2, 24, torch.float32),
        (2, 1, 64, torch.float16),
        (2, 1, 128, torch.float32),
    ],
)
@pytest.mark.parametrize(("num_splits", "fused"), [(1, False), (3, False), (3, True)])
def test_decode_small(
    hq: int, hkv: int, d: int, dtype: torch.dtype, num_splits: int, fused: bool, device, pooled, reference, tol
) -> None:
    check(LENS, hq, hkv, d, dtype, False, num_splits, device, pooled, reference, tol, fused)


@pytest.mark.parametrize(
    ("hq", "hkv", "d", "dtype"),
    [
        (4, 2, 32, torch.float32),
        (4, 2, 32, torch.float16),
        (2, 1, 16, torch.float16),
        (3, 1, 64, torch.float32),
        (2, 1, 128, torch.float16),
    ],
)
@pytest.mark.parametrize(("num_splits", "fused"), [(1, False), (3, False), (3, True), (8, True)])
def test_decode_rotates_and_stores_the_new_tokens(
    hq: int, hkv: int, d: int, dtype: torch.dtype, num_splits: int, fused: bool, device, pooled, reference, tol
) -> None:
    # the new token alone in its split (17 = one 16-token tile + 1), at the start of a context
    # (1), and an empty request whose slot must stay untouched
    check([1, 17, 70, 0, 33], hq, hkv, d, dtype, False, num_splits, device, pooled, reference, tol, fused, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(4, 2, 32), (2, 1, 64)])
@pytest.mark.parametrize(("num_splits", "fused"), [(1, False), (3, False), (3, True)])
def test_decode_applies_a_folded_norm_to_the_new_tokens(
    hq: int, hkv: int, d: int, dtype: torch.dtype, num_splits: int, fused: bool, device, pooled, reference, tol
) -> None:
    check(
        [1, 17, 70, 0, 33], hq, hkv, d, dtype, False, num_splits, device, pooled, reference, tol, fused, True, norm=True
    )


@pytest.mark.parametrize(("num_splits", "fused"), [(1, False), (3, True)])
def test_decode_folded_norm_wider_than_one_load(
    num_splits: int, fused: bool, device, pooled, reference, tol, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A residual row wider than NORM_BLOCK (40 against 16) is read in several tiles, summed alike."""
    monkeypatch.setattr(decode_attention_module, "NORM_BLOCK", 16)
    check(
        [1, 17, 70, 0, 33],
        4,
        2,
        32,
        torch.float32,
        False,
        num_splits,
        device,
        pooled,
        reference,
        tol,
        fused,
        True,
        norm=True,
    )


def test_decode_rejects_a_norm_of_other_rows(device, pooled) -> None:
    req = pooled([3, 5], 1, 16, torch.float32, False, device)
    qkv = torch.randn(2, 4, 16, device=device)
    cos_sin = cos_sin_table(16, 10000.0, {}, 16, device)
    slots = req.req_table[req.rows.long(), 0]
    new = NewTokens(qkv[:, 2:3], qkv[:, 3:], cos_sin, slots, RowNorm(torch.randn(3, 8, device=device), 1e-5))
    with pytest.raises(ValueError, match=r"new\.norm\.src must be"):
        decode_attention(
            qkv[:, :2],
            req.k_pool,
            req.v_pool,
            req.req_table,
            req.rows,
            torch.tensor([3, 5], dtype=torch.int32, device=device),
            0.25,
            1,
            new=new,
        )


def test_decode_new_tokens_need_a_float_pool(device, pooled) -> None:
    req = pooled([3, 5], 2, 16, torch.float32, True, device)
    qkv = torch.randn(2, 8, 16, device=device)
    seq_lens = torch.tensor([3, 5], dtype=torch.int32, device=device)
    cos_sin = cos_sin_table(16, 10000.0, {}, 8, device)
    new = NewTokens(qkv[:, 4:6], qkv[:, 6:], cos_sin, req.req_table[req.rows.long(), 0])
    with pytest.raises(ValueError, match="float pool"):
        decode_attention(
            qkv[:, :4],
            req.k_pool,
            req.v_pool,
            req.req_table,
            req.rows,
            seq_lens,
            0.25,
            1,
            k_scale=req.k_scale,
            v_scale=req.v_scale,
            new=new,
        )


@pytest.mark.parametrize("kv", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_splits", "fused"), [(1, False), (3, False), (3, True)])
def test_decode_small_quantized(
    kv: str, dtype: torch.dtype, num_splits: int, fused: bool, device, pooled, reference, tol
) -> None:
    check(LENS, 4, 2, 32, dtype, kv, num_splits, device, pooled, reference, tol, fused)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_e4m3_narrow_tiles(num_splits: int, device, pooled, reference, tol) -> None:
    """An e4m3 pool from E4M3_NARROW_BATCH requests on a GPU: decode_config's narrower tiles
    (the interpreter's own are 16 tokens) with bf16 q as served, over part tiles and several splits."""
    cfg = decode_config(128, torch.bfloat16, True, True, e4m3=True, batch=decode_attention_module.E4M3_NARROW_BATCH)
    assert cfg != decode_config(128, torch.bfloat16, True, True, e4m3=True, batch=1)
    check([1, 70, 130, 200], 4, 2, 32, torch.bfloat16, "fp8", num_splits, device, pooled, reference, tol, **cfg)


@pytest.mark.parametrize("fused", [False, True])
def test_decode_more_splits_than_tiles(fused: bool, device, pooled, reference, tol) -> None:
    # 8 splits of a 70-token context: only 5 have a 16-token tile, the rest exit early
    check(LENS, 4, 2, 32, torch.float32, False, 8, device, pooled, reference, tol, fused)


@pytest.mark.parametrize("rotary", [False, True])
def test_decode_fused_combine_of_more_splits_than_one_load(rotary: bool, device, pooled, reference, tol) -> None:
    # 12 splits of 16-token tiles for the 192- and 250-token requests: the last split combines
    # them in two loads of COMBINE_SPLITS (8), as one kernel serves every split count
    check([192, 250, 17, 1], 4, 2, 32, torch.float32, False, 12, device, pooled, reference, tol, True, rotary)


@pytest.mark.parametrize("split_tokens", [20, 40, 1000])
@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_decode_short_contexts_use_fewer_splits(
    split_tokens: int, quantized: bool, fused: bool, device, pooled, reference, tol
) -> None:
    # a grid of 4 splits; each request uses as many as keep split_tokens a split (the 1-token
    # request one, the 70-token one 2 or 4 or 1), and the reduce combines just those
    check(LENS, 4, 2, 32, torch.float32, quantized, 4, device, pooled, reference, tol, fused, split_tokens=split_tokens)


@pytest.mark.parametrize("fused", [False, True])
def test_decode_empty_request_gets_zeros(fused: bool, device, pooled, reference, tol) -> None:
    # a padded graph row has no context: its output is zeros, never NaN, either way
    check([0, 17, 40], 4, 2, 32, torch.float32, False, 3, device, pooled, reference, tol, fused)


@pytest.mark.parametrize("group", [16, 32])
def test_decode_large_group(group: int, device, pooled, reference, tol) -> None:
    check([9, 40], group, 1, 16, torch.float32, False, 2, device, pooled, reference, tol)


@pytest.mark.parametrize(("window", "softcap"), [(1, 0.0), (16, 2.0), (30, 0.0), (30, 2.0), (4096, 2.0)])
@pytest.mark.parametrize(("num_splits", "fused", "rotary"), [(1, False, False), (3, False, True), (3, True, False)])
def test_decode_sliding_window_and_softcap(
    window: int, softcap: float, num_splits: int, fused: bool, rotary: bool, device, pooled, reference, tol
) -> None:
    """Windows of one token, one tile, part of the longer contexts and longer than all; the
    splits divide the window, the new token (rotary) always inside it; an empty request's zeros."""
    lens = [1, 17, 70, 0, 33]
    check(lens, 4, 2, 32, torch.float32, False, num_splits, device, pooled, reference, tol, fused, rotary, False,
          window, softcap)  # fmt: skip


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("split_tokens", [1, 20])
def test_decode_window_over_many_splits(quantized: bool, split_tokens: int, device, pooled, reference, tol) -> None:
    """A grid of 8 splits over windows of 40 of contexts up to 250: each request uses those its
    window warrants, combined by the reduce kernel (which recomputes them) or the last split."""
    for fused in (False, True):
        check([192, 250, 17, 1], 4, 2, 32, torch.float16, quantized, 8, device, pooled, reference, tol, fused,
              window=40, softcap=3.0, split_tokens=split_tokens)  # fmt: skip


def test_decode_rejects_a_bad_softcap(device) -> None:
    q = torch.randn(2, 2, 16, device=device)
    pool = torch.zeros(8, 2, 16, device=device)
    ints = torch.zeros(2, dtype=torch.int32, device=device)
    table = torch.zeros(3, 8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="softcap"):
        decode_attention(q, pool, pool, table, ints, ints, 1.0, 1, softcap=-1.0)


def test_choose_num_splits() -> None:
    assert choose_num_splits(64, 8, 2048) == 1  # 512 programs already fill 132 SMs about four deep
    assert choose_num_splits(16, 8, 2048) == 3  # 128 programs: three splits give about two per SM
    assert choose_num_splits(1, 8, 2048) == 16  # few requests: split, but keep 128+ tokens a split
    assert choose_num_splits(1, 8, 100) == 1
    assert choose_num_splits(512, 8, 4096) == 1
    assert 1 <= choose_num_splits(1, 1, 1 << 20) <= 32


def test_decode_rejects_bad_group(device) -> None:
    q = torch.randn(2, 3, 16, device=device)
    pool = torch.zeros(8, 2, 16, device=device)
    ints = torch.zeros(2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="multiple"):
        decode_attention(q, pool, pool, torch.zeros(3, 8, dtype=torch.int32, device=device), ints, ints, 1.0, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quantized", [False, True, "fp8"])
def test_decode_llama3_8b(quantized: bool, pooled, reference, tol) -> None:
    lens = [2048] * 60 + [1, 100, 1000, 2047]
    splits = choose_num_splits(len(lens), 8, 2048, torch.cuda.get_device_properties(0).multi_processor_count)
    check(lens, 32, 8, 128, torch.bfloat16, quantized, splits, torch.device("cuda"), pooled, reference, tol)
    # a few requests over a grid of many splits, short ones using fewer (as in a captured graph),
    # combined by the reduce kernel and by each group's last split
    few = [1, 100, 300, 1000, 2047, 4000]
    for fused in (False, True):
        check(
            few,
            32,
            8,
            128,
            torch.bfloat16,
            quantized,
            32,
            torch.device("cuda"),
            pooled,
            reference,
            tol,
            fused,
            split_tokens=SPLIT_TOKENS,
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decode_fused_combine_is_the_reduce_launch_after_launch(pooled) -> None:
    """The last split's combine depends on the order in which splits finish: over many launches
    it gives what the reduce kernel gives, each time, and leaves the counts at zero."""
    dev = torch.device("cuda")
    lens = [1024, 700, 64, 2000]
    req = pooled(lens, 8, 128, torch.bfloat16, False, dev)
    q = torch.randn(len(lens), 32, 128, device=dev, dtype=torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    mid_o, mid_lse = decode_scratch(len(lens), 32, 128, 32, dev)
    args = (q, req.k_pool, req.v_pool, req.req_table, req.rows, seq_lens, 128**-0.5, 32)
    ref = decode_attention(*args, mid_o=mid_o, mid_lse=mid_lse, split_tokens=SPLIT_TOKENS)
    counts = torch.zeros(len(lens) * 8, dtype=torch.int32, device=dev)
    for _ in range(200):
        out = decode_attention(*args, mid_o=mid_o, mid_lse=mid_lse, counts=counts, split_tokens=SPLIT_TOKENS)
        torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
    assert not counts.any()


class _Keys:
    """Stands in for a kernel's launcher: records the compiled-kernel key of each call instead
    of launching (Launcher.key: what Triton would specialise a compile on). Under the
    interpreter the kernel is an InterpretedFunction: its JITFunction is made from the same
    function and decorator arguments."""

    def __init__(self, kernel) -> None:
        if not isinstance(kernel, triton.runtime.jit.JITFunction):
            options = {k: v for k, v in kernel.kwargs.items() if v is not None}
            kernel = triton.runtime.jit.JITFunction(kernel.fn, **options)
        self.launcher, self.keys = Launcher(kernel), []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.keys.append(self.launcher.key(args, kwargs, 0))


@pytest.mark.parametrize(("hq", "hkv", "d"), [(32, 8, 128), (4, 2, 16)])  # the 8B shape, the tiny models'
@pytest.mark.parametrize(
    ("graph_splits", "mixed_splits", "fused"), [(1, 1, False), (8, 3, True), (17, 12, False), (32, 9, False)]
)
@pytest.mark.parametrize("norm", [False, True])
def test_steps_with_prompt_tokens_reuse_the_decode_graphs_kernels(
    hq: int, hkv: int, d: int, graph_splits: int, mixed_splits: int, fused: bool, norm: bool, monkeypatch
) -> None:
    """A decode graph's call (new tokens rotated and stored in the kernel, with the folded norm
    or without) and an eager one in a step with prompt tokens (its decodes' q at an offset in
    the step's tokens, no new tokens, a split count of its own) key the same compiled kernels:
    no compile while serving."""
    import services.worker.kernels.decode_combine as dc
    import services.worker.kernels.decode_split as ds

    splits_rec, reduce_rec = _Keys(ds._decode_split_kernel), _Keys(dc._decode_reduce_kernel)
    monkeypatch.setattr(ds, "split_launch", splits_rec)
    monkeypatch.setattr(dc, "_decode_reduce_launch", reduce_rec)
    bd, e = 3, 5
    pool = torch.zeros(64, hkv, d, dtype=torch.bfloat16)
    table = torch.zeros(bd + 1, 4096, dtype=torch.int32)
    rows = torch.arange(bd, dtype=torch.int32)
    lens = torch.full((bd,), 40, dtype=torch.int32)
    counts = torch.zeros(64, dtype=torch.int32) if fused else None
    cos_sin = cos_sin_table(d, 500000.0, {}, 4096, "cpu")

    def call(tokens: int, first: int, splits: int, rotary: bool) -> None:
        qkv = torch.zeros(tokens, hq + 2 * hkv, d, dtype=torch.bfloat16)
        rows_of_step = qkv[first : first + bd]
        q, k, v = rows_of_step[:, :hq], rows_of_step[:, hq : hq + hkv], rows_of_step[:, hq + hkv :]
        out = torch.empty_like(qkv[:, :hq])[first : first + bd]
        scratch = decode_scratch(bd, hq, d, splits, torch.device("cpu"))
        row_norm = RowNorm(torch.zeros(bd, 4096, dtype=torch.bfloat16), 1e-5) if norm else None
        new = NewTokens(k, v, cos_sin, torch.zeros(bd, dtype=torch.int32), row_norm) if rotary else None
        decode_attention(
            q,
            pool,
            pool,
            table,
            rows,
            lens,
            d**-0.5,
            splits,
            out=out,
            split_tokens=SPLIT_TOKENS,
            mid_o=scratch[0],
            mid_lse=scratch[1],
            counts=counts,
            new=new,
        )

    call(bd, 0, graph_splits, rotary=True)  # a decode graph: the step is its decodes
    call(e + bd, e, mixed_splits, rotary=False)  # after e prompt tokens, rotated and stored before
    assert splits_rec.keys[0] == splits_rec.keys[1]
    assert len(reduce_rec.keys) == (0 if fused or graph_splits == 1 else 2)
    assert len(set(map(str, reduce_rec.keys))) <= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quantized", [False, True])
def test_decode_gemma2_9b_window_and_softcap(quantized: bool, pooled, reference, tol) -> None:
    """Gemma 2 9B's heads with its 4096-token window and soft cap 50, contexts shorter and far
    longer than the window, over a grid of many splits (the window's) and one split."""
    lens = [1, 100, 4096, 4097, 9000]
    for splits, fused in ((16, False), (16, True), (1, False)):
        check(
            lens,
            16,
            8,
            256,
            torch.bfloat16,
            quantized,
            splits,
            torch.device("cuda"),
            pooled,
            reference,
            tol,
            fused,
            window=4096,
            softcap=50.0,
            split_tokens=SPLIT_TOKENS,
        )


def test_int8_scales_must_start_on_a_word() -> None:
    """e4m3's exponent scales are read four bytes at a time (kv_scale.load_kv_scale)."""
    q = torch.randn(1, 4, 32)
    pool = torch.zeros(8, 2, 32, dtype=torch.float8_e4m3fn)
    scales = torch.zeros(17, dtype=torch.int8)[1:].view(8, 2)
    table, one = torch.zeros(1, 8, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="4-byte boundary"):
        decode_attention(q, pool, pool, table, one - 1, one, 1.0, 1, k_scale=scales, v_scale=scales)
