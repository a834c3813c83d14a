"""y[b] += w @ x[b] for a decode step's few rows, its weight loaded before its input exists.

At batch 1 the o projection follows decode attention, which reads a few MB in about 10 µs
and leaves HBM idle; cuBLAS's product then takes about 13 µs for 34 MB, 6 µs over its bytes
at the copy rate, even with its weight already in L2 (r128). Launched with programmatic
dependent launch (PDL) after a kernel that lets its dependents start early (decode attention
with pdl), this kernel's programs are resident while attention still runs. Each owns ROWS
rows of w: it loads the first HOLD of them into registers and asks L2 for the rest (Hopper's
bulk prefetch, no registers held), and only then waits for the kernel before (gdc_wait). After
the wait it reads x (a few KB), reduces the held rows against it, then streams the rest from
L2, and adds each result into y in place (a residual stream: the beta-1 GEMM the step ran).

Without PDL (pdl=False, and always under TRITON_INTERPRET=1) the same kernel runs after the
kernel before it has finished: the same results, nothing overlapped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import launcher

try:  # Triton >= 3.4 on CUDA
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover - an older Triton: PDL is never asked for
    gdc_wait = None

MAX_B = 4  # rows of x: the loads before the wait pay off only where a step reads little else


@triton.jit
def _prefetch_rows(addr, nbytes, LANES: tl.constexpr):
    """Ask L2 for bytes [addr, addr + nbytes), contiguous, split over LANES threads (one bulk
    prefetch each, 16-byte aligned pieces)."""
    lane = tl.arange(0, LANES).to(tl.int64)
    piece = nbytes // LANES
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [addr + lane * piece, tl.full([LANES], piece, tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _pinned(w):
    """w as it is, through an opaque move the compiler keeps after the wait before it: so that
    the held rows are widened to float32 only after it, not while they are held (twice the
    registers)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=w.dtype, is_pure=False, pack=2)


@triton.jit
def _add_rows(w, x_ptr, y_ptr, rows, offs_k, x_stride, y_stride, B: tl.constexpr, y_old=None):
    """y[b, rows] += w [R, K] @ x[b] for b < B, float32 sums, y rounded once; y_old: y[0, rows]
    read already (B 1 only)."""
    wf = w.to(tl.float32)
    for b in tl.static_range(B):
        x = tl.load(x_ptr + b * x_stride + offs_k).to(tl.float32)
        acc = tl.sum(wf * x[None, :], axis=1)
        yp = y_ptr + b * y_stride + rows
        old = tl.load(yp) if y_old is None else y_old
        tl.store(yp, (old.to(tl.float32) + acc).to(y_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["w_addr", "x_stride", "y_stride"])
def _held_matvec_kernel(x_ptr, w_ptr, y_ptr, w_addr, x_stride, y_stride, K: tl.constexpr, ROWS: tl.constexpr,
                        HOLD: tl.constexpr, CHUNK: tl.constexpr, B: tl.constexpr, PDL: tl.constexpr,
                        PREFETCH: tl.constexpr, LANES: tl.constexpr, EARLY_Y: tl.constexpr = False,
                        EVICT: tl.constexpr = ""):  # fmt: skip
    r0 = tl.program_id(0) * ROWS
    offs_k = tl.arange(0, K)
    held_rows = r0 + tl.arange(0, HOLD)
    held = tl.load(w_ptr + held_rows.to(tl.int64)[:, None] * K + offs_k[None, :], eviction_policy=EVICT)
    if PREFETCH and ROWS > HOLD:
        _prefetch_rows(w_addr + (r0 + HOLD).to(tl.int64) * K * 2, (ROWS - HOLD) * K * 2, LANES)
    y_held = None
    if EARLY_Y:  # B 1: the residual rows it adds into, which the kernel before does not write
        y_held = tl.load(y_ptr + held_rows)
    if PDL:
        gdc_wait()
        held = _pinned(held)
    _add_rows(held, x_ptr, y_ptr, held_rows, offs_k, x_stride, y_stride, B, y_held)
    for c in tl.static_range(HOLD, ROWS, CHUNK):
        rows = r0 + c + tl.arange(0, CHUNK)
        w = tl.load(w_ptr + rows.to(tl.int64)[:, None] * K + offs_k[None, :], eviction_policy=EVICT)
        _add_rows(w, x_ptr, y_ptr, rows, offs_k, x_stride, y_stride, B)


_held_matvec_launch = launcher(_held_matvec_kernel)


def held_matvec_(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, rows: int = 32, hold: int = 16, chunk: int = 8,
                 pdl: bool = False, prefetch: bool = True, num_warps: int = 8, early_y: bool = False,
                 evict: str = "") -> torch.Tensor:  # fmt: skip
    """y [B, N] += x [B, K] @ w [N, K].t() in place, B <= MAX_B, bf16 or fp16, w contiguous,
    N a multiple of rows, K a power of two. Each program owns rows rows of w, the first hold
    loaded before it waits (pdl) and the rest in chunks of chunk after, asked of L2 first
    (prefetch, CUDA only). pdl: launched with programmatic dependent launch (CUDA, Hopper on)."""
    if x.dim() != 2 or w.dim() != 2 or y.dim() != 2 or not w.is_contiguous() or x.stride(-1) != 1 or y.stride(-1) != 1:
        raise ValueError("held_matvec_: x [B, K], y [B, N] with contiguous rows and w [N, K] contiguous")
    (bsz, k), n = x.shape, w.shape[0]
    if w.shape[1] != k or y.shape != (bsz, n):
        raise ValueError(f"held_matvec_: x {tuple(x.shape)}, w {tuple(w.shape)} and y {tuple(y.shape)} do not agree")
    if not 1 <= bsz <= MAX_B:
        raise ValueError(f"held_matvec_: 1 to {MAX_B} rows of x, got {bsz}")
    if x.dtype != w.dtype or y.dtype != w.dtype or w.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(
            f"held_matvec_: x, w and y must share a 16-bit float dtype, got {x.dtype}, {w.dtype}, {y.dtype}"
        )
    if (
        k & (k - 1)
        or hold & (hold - 1)
        or chunk & (chunk - 1)
        or n % rows
        or not 0 < hold <= rows
        or (rows - hold) % chunk
    ):
        raise ValueError(f"held_matvec_: K {k} a power of two, N {n} a multiple of rows {rows}, hold and chunk fit it")
    if pdl and (not x.is_cuda or gdc_wait is None):
        raise ValueError("held_matvec_: PDL needs CUDA and a Triton with grid dependency control")
    lanes = 32 * num_warps
    cuda = x.is_cuda
    _held_matvec_launch[(n // rows,)](
        x, w, y, w.data_ptr(), x.stride(0), y.stride(0), K=k, ROWS=rows, HOLD=hold, CHUNK=chunk, B=bsz, PDL=pdl,
        PREFETCH=bool(prefetch and cuda and (rows - hold) * k * 2 % (16 * lanes) == 0), LANES=lanes,
        EARLY_Y=early_y and bsz == 1, EVICT=evict, num_warps=num_warps, **({"launch_pdl": True} if pdl else {}),
    )  # fmt: skip
    return y
