"""The second half of a split-K product: the partial sums of S shares of the K range, [S, M, N]
float32, added in share order and rounded once to out's dtype (accumulate: out's old value added
last, as an unsplit product adds it to its float32 sum).

A weight GEMM at decode batch sizes (M of 1 to 64) has few output tiles: Llama-3-8B's o and down
projections (N 4096) make 64 tiles of 64 columns for an H200's 132 SMs, too few programs to keep
its memory busy. Cutting K into shares gives each tile several programs; their sums meet here, in
a fixed order (the same bits every run, unlike atomic adds). ``choose_split`` is the rule the
weight GEMMs (int4_matmul.py, fp8_weight_matmul.py) share: enough programs for WAVES of them per
SM, each share at least MIN_STEPS steps of K, and the partial sums' traffic (written, then read
here: 8 bytes an output a share) at most a quarter of the weight's bytes, so the cut shrinks as
M grows (Llama-3-8B's int4 down projection: 9 shares at M = 1, 3 at M = 64).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher

WAVES = 4  # programs per SM a split aims for: several in flight hide each one's memory latency
MIN_STEPS = 4  # K steps a share keeps at least
MAX_SPLIT = 16
CPU_SMS = 4  # what the interpreter is taken to have: the CPU tests' small shapes still split
BLOCK_N = 256


@triton.jit
def _split_k_sum_kernel(
    part_ptr,
    out_ptr,
    N,
    share_stride,
    out_row_stride,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ACCUMULATE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    part_ptrs = part_ptr + row * N + offs
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for _ in range(SPLIT):
        acc += tl.load(part_ptrs, mask=mask, other=0.0)
        part_ptrs += share_stride
    out_ptrs = out_ptr + row * out_row_stride + offs
    if ACCUMULATE:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


_split_k_sum_launch = launcher(_split_k_sum_kernel)


def split_k_sum(partials: torch.Tensor, out: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """partials [S, M, N] float32 contiguous -> out [M, N] (last dim contiguous) = their sum, plus
    out's old value when accumulate. -> out."""
    if partials.dim() != 3 or partials.dtype != torch.float32 or not partials.is_contiguous():
        raise ValueError(f"split_k_sum: partials must be [S, M, N] float32 contiguous, got {tuple(partials.shape)}")
    s, m, n = partials.shape
    if out.shape != (m, n) or out.stride(-1) != 1 or out.device != partials.device:
        raise ValueError(f"split_k_sum: out must be [{m}, {n}] on {partials.device} with a contiguous last dim")
    if m == 0:
        return out
    _split_k_sum_launch[(m, cdiv(n, BLOCK_N))](
        partials,
        out,
        n,
        partials.stride(0),
        out.stride(0),
        SPLIT=s,
        BLOCK_N=BLOCK_N,
        ACCUMULATE=accumulate,
        num_warps=4,
    )
    return out


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors; CPU_SMS for the CPU (the interpreter)."""
    if device.type != "cuda":
        return CPU_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_split(tiles: int, k_steps: int, m: int, n: int, weight_bytes: int, sms: int) -> int:
    """Shares of K for a GEMM of `tiles` output tiles and `k_steps` steps of K, whose weight is
    weight_bytes, with an [m, n] output, on sms SMs (the module's docstring: the rule)."""
    want = cdiv(WAVES * sms, tiles)
    by_steps = k_steps // MIN_STEPS
    by_traffic = weight_bytes // (4 * 8 * m * n)
    return max(1, min(want, by_steps, by_traffic, MAX_SPLIT))


def shares(k_steps: int, split: int) -> tuple[int, int]:
    """(steps a share, shares): split shares of whole steps, none of them empty."""
    per = cdiv(k_steps, split)
    return per, cdiv(k_steps, per)


class SplitPlan(NamedTuple):
    """A weight-only GEMM's launch over K shares: its row block, its grid, the K elements a share
    reads, and the float32 partial sums its shares write (None: one share, straight into out)."""

    block_m: int
    grid: tuple[int, int, int]
    share_k: int
    partials: torch.Tensor | None


def plan_split(
    m: int,
    n: int,
    k_steps: int,
    block_n: int,
    block_k: int,
    weight_bytes: int,
    device: torch.device,
    split: int | None,
    dot: bool = True,
) -> SplitPlan:
    """The launch of an [m, n] product over k_steps steps of block_k: row blocks of 16, 32 or 64
    (the batch's; a tl.dot operand has at least 16 rows), or without dot (the FMA path) the batch
    rounded up to a power of two, and split shares of K (None: choose_split's)."""
    if dot:
        block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    else:
        block_m = triton.next_power_of_2(m)
    tiles = cdiv(m, block_m) * cdiv(n, block_n)
    if split is None:
        split = choose_split(tiles, k_steps, m, n, weight_bytes, sm_count(device))
    per, split = shares(k_steps, max(1, split))
    partials = torch.empty((split, m, n), dtype=torch.float32, device=device) if split > 1 else None
    return SplitPlan(block_m, (cdiv(m, block_m), cdiv(n, block_n), split), per * block_k, partials)
