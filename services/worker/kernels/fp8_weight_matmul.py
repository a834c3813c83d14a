"""x @ W.t() for an FP8 weight (models/fp8_weight.py: e4m3 [N, K], one float32 scale an output
row) at small batch: the activations stay in their dtype (no per-token quantization, no second
launch for it), each weight tile is converted to x's dtype in registers (every e4m3 value is
exact in bf16 and fp16), and the products accumulate in float32; each output column is then
multiplied by its row's scale once, as W[n, k] = weight[n, k] * scale[n] allows.

At decode sizes the product is a read of the weight: at M = 1 its bytes are the whole cost, and
torch._scaled_mm's FP8 kernels (with the quantization of x before them) spend more than a bf16
product on it. Here a tile is BLOCK_N output rows against BLOCK_M tokens, and the weight tile
is the dot's first operand ([BLOCK_N, BLOCK_K]: its rows are K-contiguous as stored, and the
wide side of the product sits where the tensor cores' instruction is widest), the tokens its
second. A Tile with dot=False (at most FMA_MAX_M rows) replaces the dot, whose BLOCK_M of 16
is mostly padding at M = 1, by an FMA reduction: each row of x (BLOCK_M the batch rounded up to
a power of two) times the weight tile in float32, summed over K. The K range is cut into shares
(split_k_sum.py's choose_split) so a batch of one still puts several programs on every SM; the
shares' float32 sums meet in split_k_sum, and an unsplit product writes its output directly.
A Tile with x8=True quantizes x per token first (fp8_quant_rows.py, each row's absmax / 448)
and runs the dot on the FP8 tensor cores, e4m3 against e4m3, both scales applied to the float32
sums: past about 16 rows the conversion of every weight tile to bf16 and a bf16 dot of 32 to 256
rows cost more than the extra launch (on the H200 at 64 rows, docs/performance.md).
The tile, warps, stages, split, dot and x8 are a Tile (gemm_tiles.py): the caller's, else
FP8_TILES' entry for the shape and batch, else FP8_DEFAULT.
layers/fp8_product.py sends products of up to TRITON_MAX_M rows here, and larger ones that
FP8_TILES has an entry for; the rest go to torch._scaled_mm.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.fp8_quant_rows import attached_rows, fp8_quant_rows
from services.worker.kernels.gemm_tiles import FP8_DEFAULT, FP8_TILES, Tile, check_rows, lookup
from services.worker.kernels.launch import cdiv, launcher
from services.worker.kernels.split_k_sum import plan_split, split_k_sum
from services.worker.models.fp8_weight import FP8, Fp8Weight

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _fp8_weight_matmul_kernel(
    x_ptr,
    xs_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    x_row_stride,
    w_row_stride,
    out_row_stride,
    share_stride,
    k_per_share,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    PARTIAL: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    IEEE: tl.constexpr,
    DOT: tl.constexpr,
    X8: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_lo = tl.program_id(2) * k_per_share
    k_hi = tl.minimum(k_lo + k_per_share, K)
    dtype = x_ptr.dtype.element_ty
    # the weight's rows [BLOCK_N, BLOCK_K] and the tokens as columns [BLOCK_K, BLOCK_M]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * w_row_stride + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[None, :].to(tl.int64) * x_row_stride + offs_k[:, None]
    cols = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        in_k = k0 + offs_k < k_hi
        if EVEN_K:
            w = tl.load(w_ptrs + k0, mask=mask_n[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs + k0, mask=mask_n[:, None] & in_k[None, :], other=0.0)
        if DOT:
            if EVEN_K:
                xt = tl.load(x_ptrs + k0, mask=mask_m[None, :], other=0.0)
            else:
                xt = tl.load(x_ptrs + k0, mask=mask_m[None, :] & in_k[:, None], other=0.0)
            if X8:  # e4m3 against e4m3 on the FP8 tensor cores
                acc += tl.dot(w, xt)
            elif IEEE:
                acc += tl.dot(w.to(dtype), xt, input_precision="ieee")
            else:
                acc += tl.dot(w.to(dtype), xt)
        else:
            # FMA: each token row times the float32 weight tile, summed over K, into its column;
            # a row past M reads row M - 1 (its column is not stored), so the loads need no row mask
            wf = w.to(tl.float32)
            for i in tl.static_range(BLOCK_M):
                row = tl.minimum(tl.program_id(0) * BLOCK_M + i, M - 1)
                x_row = x_ptr + row.to(tl.int64) * x_row_stride + k0 + offs_k
                if EVEN_K:
                    xi = tl.load(x_row).to(tl.float32)  # [BLOCK_K]
                else:
                    xi = tl.load(x_row, mask=in_k, other=0.0).to(tl.float32)
                part = tl.sum(wf * xi[None, :], axis=1)  # [BLOCK_N]
                if BLOCK_M == 1:
                    acc += part[:, None]
                else:
                    acc += tl.where(cols[None, :] == i, part[:, None], 0.0)
    scale = tl.load(s_ptr + offs_n, mask=mask_n, other=0.0)
    acc = acc * scale[:, None]  # [BLOCK_N, BLOCK_M]
    if X8:
        acc = acc * tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[None, :]
    mask = mask_n[:, None] & mask_m[None, :]
    if PARTIAL:
        part_ptrs = out_ptr + tl.program_id(2).to(tl.int64) * share_stride
        tl.store(part_ptrs + offs_m[None, :].to(tl.int64) * N + offs_n[:, None], acc, mask=mask)
    else:
        out_ptrs = out_ptr + offs_m[None, :].to(tl.int64) * out_row_stride + offs_n[:, None]
        if ACCUMULATE:
            acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_fp8_weight_matmul_launch = launcher(_fp8_weight_matmul_kernel)


def _check(x: torch.Tensor, w: Fp8Weight, out: torch.Tensor | None) -> None:
    n, k = w.shape
    if x.dim() != 2 or x.shape[1] != k or x.stride(-1) != 1 or x.dtype not in DTYPES:
        raise ValueError(
            f"fp8_weight_matmul: x must be [M, {k}] of {DTYPES} with a contiguous last dim, "
            f"got {tuple(x.shape)} {x.dtype}"
        )
    if w.weight.dtype != FP8 or w.weight.stride(-1) != 1 or w.weight.device != x.device or w.scale.device != x.device:
        raise ValueError(f"fp8_weight_matmul: the weight must be e4m3 with contiguous rows, on {x.device}")
    m = x.shape[0]
    if out is not None and (out.shape != (m, n) or out.stride(-1) != 1 or out.dtype != x.dtype):
        raise ValueError(f"fp8_weight_matmul: out must be [{m}, {n}] {x.dtype} with a contiguous last dim")


def fp8_weight_matmul(
    x: torch.Tensor,
    w: Fp8Weight,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    tile: Tile | None = None,
) -> torch.Tensor:
    """x [M, K] (float32, float16 or bfloat16, last dim contiguous) @ W.t() -> [M, N] in x's dtype
    (into out when given; accumulate: added to out). tile: the launch (None: the shape's in
    FP8_TILES, else FP8_DEFAULT); a dot=False tile for M > FMA_MAX_M is refused (ValueError).
    An x8 tile quantizes x per token to e4m3 first (fp8_quant_rows) and multiplies on the FP8
    tensor cores."""
    _check(x, w, out)
    (m, k), n = x.shape, w.shape[0]
    if out is None:
        assert not accumulate, "accumulate needs out"
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    t = tile if tile is not None else lookup(FP8_TILES, FP8_DEFAULT, m, n, k)
    check_rows("fp8_weight_matmul", t, m)
    plan = plan_split(m, n, cdiv(k, t.block_k), t.block_n, t.block_k, n * k, x.device, t.split, t.dot)
    # x's e4m3 rows: those the kernel that wrote x stored beside it, else a launch of their own;
    # w.scale stands in for a pointer the kernel does not read
    xq, xs = (attached_rows(x) or fp8_quant_rows(x)) if t.x8 else (x, w.scale)
    _fp8_weight_matmul_launch[plan.grid](
        xq,
        xs,
        w.weight,
        w.scale,
        out if plan.partials is None else plan.partials,
        m,
        n,
        k,
        xq.stride(0),
        w.weight.stride(0),
        out.stride(0),
        m * n,
        plan.share_k,
        BLOCK_M=plan.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        EVEN_K=k % t.block_k == 0,
        PARTIAL=plan.partials is not None,
        ACCUMULATE=accumulate,
        IEEE=x.dtype == torch.float32,
        DOT=t.dot,
        X8=t.x8,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )
    return out if plan.partials is None else split_k_sum(plan.partials, out, accumulate)
