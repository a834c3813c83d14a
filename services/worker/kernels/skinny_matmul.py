"""y = x @ w.t() for a few rows of x: a decode step's projections, where the weights are
read once and the activations are a handful of rows.

A decode step at small batches is bound by reading the weights, and cuBLAS's kernels for a
one-row product run well under the copy rate on the smaller projections (docs/benchmarks.md,
r62: o at 59 % and qkv at 77 % on an H200), bound by their own latency. Here each program
owns BLOCK_N output columns (weight rows) and walks K in BLOCK_K tiles, pipelined by Triton
(num_stages); the product is computed transposed, w_tile @ x_tile.t(), so the weight rows
fill the MMA's M side and the batch rows (padded to BLOCK_M, at least 16) its N side.

With SPLIT_K > 1 each program takes a K range of its columns, writes a float32 partial, and
the last program of a column tile to finish (an atomic count, acquire-release) sums the
partials and writes y; the count is put back to zero for the next launch, so the launch is
one kernel and can be captured in a CUDA graph. Nothing is read on the host.

PDL (Hopper's programmatic dependent launch, launched with launch_pdl): a one-row product takes
about 4 µs more than its bytes need at the copy rate, whether cuBLAS or this kernel runs it
(r75), the launch and the first loads' latency. Launched this way, the kernel may start while
the one before it (whose output is x) is still running: each program first asks L2 for the
first PREFETCH columns of its weight rows (which nothing before it writes), then waits for the
kernel before to finish (gdc_wait), lets the kernel after it launch, and runs as above.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.extend_attention import dot
from services.worker.kernels.launch import cdiv, launcher, next_pow2

try:  # Triton >= 3.4 on CUDA; the kernel uses them only when launched with PDL
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton: PDL is never asked for
    gdc_launch_dependents = gdc_wait = None

MAX_M = 64  # rows of x one launch takes: past this cuBLAS's GEMMs are the better kernel
MAX_SPLIT_K = 16


@triton.jit(do_not_specialize=["M", "x_stride", "y_stride"])
def _skinny_matmul_kernel(x_ptr, w_ptr, y_ptr, part_ptr, cnt_ptr, M, N, K, x_stride, w_stride, y_stride,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          SPLIT_K: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
                          PREFETCH: tl.constexpr = 0):  # fmt: skip
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    nmask = offs_n < N
    mmask = offs_m < M
    k_len = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K  # whole tiles per split
    k_start = split * k_len
    k_end = tl.minimum(K, k_start + k_len)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * w_stride
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * x_stride
    if PDL:
        if PREFETCH > 0:  # one address per 128-byte line of the first PREFETCH columns
            lines = k_start + tl.arange(0, PREFETCH // 64) * 64
            _prefetch_l2(w_rows + lines[None, :], nmask[:, None] & (lines < k_end)[None, :])
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + offs_k
        kmask = ks < k_end
        w = tl.load(w_rows + ks[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)  # [BLOCK_N, BLOCK_K]
        x = tl.load(x_rows + ks[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        acc += dot(w, tl.trans(x), IEEE)
    y_ptrs = y_ptr + offs_m.to(tl.int64)[None, :] * y_stride + offs_n[:, None]  # [BLOCK_N, BLOCK_M], y[m, n]
    ymask = nmask[:, None] & mmask[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=ymask)
    else:
        # partials [SPLIT_K, BLOCK_M, N]: this split's slice of column tile pid_n
        tile = offs_m[None, :] * N + offs_n[:, None]
        tl.store(part_ptr + split * BLOCK_M * N + tile, acc, mask=ymask)
        # every thread's stores are made before the count is (the barrier, then a release);
        # the program that counts last sees every split's (acquire; it reads them through L2)
        tl.debug_barrier()
        if tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next launch
            total = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(part_ptr + s * BLOCK_M * N + tile, mask=ymask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=ymask)


@triton.jit
def _prefetch_l2(ptrs, mask):
    """Ask L2 for the lines at ptrs where mask (no data comes back to the program)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


_skinny_matmul_launch = launcher(_skinny_matmul_kernel)

# per device: zeroed tile counters, grown on demand, and left zero by every launch. One stream
# at a time may use them (the worker runs its steps on one).
_counters: dict[torch.device, torch.Tensor] = {}


def _tile_counters(n: int, device: torch.device) -> torch.Tensor:
    cnt = _counters.get(device)
    if cnt is None or cnt.numel() < n:
        cnt = _counters[device] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return cnt


def skinny_config(m: int, n: int, k: int, is_cuda: bool) -> dict[str, int]:
    """The launch config for an [m, k] @ [k, n] product: BLOCK_N, BLOCK_K, SPLIT_K and Triton's
    num_warps / num_stages. The CPU (the interpreter) gets small tiles: it runs them one by one."""
    if not is_cuda:
        return {"BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1, "num_warps": 4, "num_stages": 1}
    split = 1
    while split < MAX_SPLIT_K and cdiv(n, 32) * split < 132 and k // (split * 2) >= 1024:
        split *= 2  # too few column tiles to give every SM one: split K as well
    return {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": split, "num_warps": 4, "num_stages": 4}


def check_skinny_args(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError(
            f"skinny_matmul: x [M, K] and w [N, K] need a contiguous last dim, got {tuple(x.shape)}, {tuple(w.shape)}"
        )
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"skinny_matmul: x has K={x.shape[1]} but w has K={w.shape[1]}")
    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"skinny_matmul: x and w must share dtype and device, got {x.dtype}, {w.dtype}")
    if x.shape[0] > MAX_M:
        raise ValueError(f"skinny_matmul: at most {MAX_M} rows, got {x.shape[0]}")
    if out is not None and (out.shape != (x.shape[0], w.shape[0]) or out.dtype != x.dtype or out.stride(-1) != 1):
        raise ValueError(f"skinny_matmul: out must be [{x.shape[0]}, {w.shape[0]}] {x.dtype}, contiguous rows")


def skinny_matmul(
    x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, pdl: bool = False, **config: int
) -> torch.Tensor:
    """x [M, K] @ w [N, K].t() -> [M, N] in x's dtype, float32 accumulation, M <= MAX_M.
    pdl: launch with programmatic dependent launch (CUDA, Hopper on), prefetching config's
    PREFETCH columns (a multiple of 64) of the weights before waiting on the kernel before.
    config overrides skinny_config's BLOCK_N / BLOCK_K / SPLIT_K / num_warps / num_stages."""
    check_skinny_args(x, w, out)
    m, k = x.shape
    n = w.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    cfg = skinny_config(m, n, k, x.is_cuda) | config
    split, block_n, block_m = cfg["SPLIT_K"], cfg["BLOCK_N"], max(16, next_pow2(m))
    if not 1 <= split <= MAX_SPLIT_K:
        raise ValueError(f"skinny_matmul: SPLIT_K must be in [1, {MAX_SPLIT_K}], got {split}")
    if pdl and (not x.is_cuda or gdc_wait is None):
        raise ValueError("skinny_matmul: PDL needs CUDA and a Triton with grid dependency control")
    tiles = cdiv(n, block_n)
    if split > 1:
        part = torch.empty((split, block_m, n), dtype=torch.float32, device=x.device)
        cnt = _tile_counters(tiles, x.device)
    else:
        part, cnt = out, out  # not read: any tensors of the same kinds
    _skinny_matmul_launch[(tiles, split)](
        x, w, out, part, cnt, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"], SPLIT_K=split, IEEE=x.dtype == torch.float32,
        PDL=bool(pdl), PREFETCH=cfg.get("PREFETCH", 0) if pdl else 0, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return out
