"""Tokens' expert choices sorted by expert into blocks: the layout the grouped GEMM
(fused_moe.py) reads, so each of its programs multiplies one block of rows by one expert.

The k choices of T tokens are n = T * k entries, entry j being token j // k's choice j % k.
``sorted_ids`` lists the entries expert by expert, each expert's run padded with the value n
(no entry) to a multiple of BLOCK_M; ``block_expert`` gives each block of BLOCK_M positions its
expert, -1 past the last run. The order of the entries within a run is whatever the atomics
gave: every entry's row is computed on its own, so it does not change a result.

Both outputs have sizes fixed by T, k and E alone, so the layout never needs the host (no sync,
and it can be captured in a CUDA graph): at most min(E, n) experts have entries and each pads
fewer than BLOCK_M positions, so n + min(E, n) * (BLOCK_M - 1) positions hold any routing.

One program does it all, in phases separated by barriers: it counts each expert's entries
(atomics into a scratch row it zeroes itself), turns the counts into padded run starts, writes
the runs' padding and every block's expert, then places each entry at its expert's next
position (an atomic cursor per expert). On an H200 (tools/bench_moe.py): 2-9 µs for up to 64
tokens; for 2048 tokens 17 µs at Mixtral's 8 experts, top-2, and 89 µs at Qwen3-MoE's 128,
top-8 (13 % of that layer's experts), where one program's loops over 16384 entries show: spread
over several programs first if prefills of that size matter.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher, next_pow2

CHUNK = 1024  # entries a loop iteration reads
BLOCKS_BUDGET = 4096  # block-by-expert comparisons a loop iteration makes


@triton.jit
def _moe_align_kernel(
    ids_ptr,
    sorted_ptr,
    block_expert_ptr,
    scratch_ptr,
    n,
    max_blocks,
    BLOCK_M: tl.constexpr,
    E_POW2: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCKS_CHUNK: tl.constexpr,
):
    experts = tl.arange(0, E_POW2)
    counts_ptr = scratch_ptr  # [E_POW2] entries per expert
    cursor_ptr = scratch_ptr + E_POW2  # [E_POW2] each expert's next free position
    tl.store(counts_ptr + experts, tl.zeros([E_POW2], dtype=tl.int32))
    tl.debug_barrier()
    for start in range(0, n, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        mask = offs < n
        ids = tl.load(ids_ptr + offs, mask=mask, other=0)
        tl.atomic_add(counts_ptr + ids, 1, mask=mask)
    tl.debug_barrier()
    counts = tl.load(counts_ptr + experts, volatile=True)  # [E_POW2], 0 past the real experts
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(cursor_ptr + experts, starts)
    # the padding of each run's last block: positions starts + counts .. ends
    r = tl.arange(0, BLOCK_M)
    pad = (starts + counts)[:, None] + r[None, :]  # [E_POW2, BLOCK_M]
    no_entry = tl.zeros([E_POW2, BLOCK_M], dtype=tl.int32) + n
    tl.store(sorted_ptr + pad, no_entry, mask=r[None, :] < (padded - counts)[:, None])
    # a block's expert: the number of runs that end at or before its first position
    for b0 in range(0, max_blocks, BLOCKS_CHUNK):
        blocks = b0 + tl.arange(0, BLOCKS_CHUNK)
        first = blocks * BLOCK_M
        owner = tl.sum((ends[None, :] <= first[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + blocks, tl.where(first < total, owner, -1), mask=blocks < max_blocks)
    tl.debug_barrier()
    for start in range(0, n, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        mask = offs < n
        ids = tl.load(ids_ptr + offs, mask=mask, other=0)
        pos = tl.atomic_add(cursor_ptr + ids, 1, mask=mask)
        tl.store(sorted_ptr + pos, offs, mask=mask)


_moe_align_launch = launcher(_moe_align_kernel)


class AlignedEntries(NamedTuple):
    sorted_ids: torch.Tensor  # [max_blocks * BLOCK_M] int32: entries by expert, runs padded with n
    block_expert: torch.Tensor  # [max_blocks] int32: each block's expert, -1 past the last run
    block_m: int


def max_blocks(num_entries: int, num_experts: int, block_m: int) -> int:
    """The blocks that hold any routing of num_entries entries over num_experts experts."""
    return cdiv(num_entries + min(num_experts, num_entries) * (block_m - 1), block_m)


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedEntries:
    """ids [T, k] (int32 or int64, each in [0, num_experts)): each token's experts -> the
    entries sorted by expert into blocks of block_m (a power of two)."""
    if ids.dim() != 2 or not ids.is_contiguous() or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"moe_align: ids must be a contiguous [T, k] int tensor, got {tuple(ids.shape)} {ids.dtype}")
    if block_m < 1 or block_m & (block_m - 1) or num_experts < 1:
        raise ValueError(f"moe_align: block_m {block_m} must be a power of two and num_experts {num_experts} >= 1")
    n = ids.numel()
    blocks = max_blocks(n, num_experts, block_m)
    device = ids.device
    sorted_ids = torch.empty(blocks * block_m, dtype=torch.int32, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=device)
    if n == 0:
        return AlignedEntries(sorted_ids, block_expert, block_m)
    e_pow2 = next_pow2(num_experts)
    scratch = torch.empty(2 * e_pow2, dtype=torch.int32, device=device)
    _moe_align_launch[(1,)](
        ids,
        sorted_ids,
        block_expert,
        scratch,
        n,
        blocks,
        BLOCK_M=block_m,
        E_POW2=e_pow2,
        CHUNK=min(CHUNK, next_pow2(n)),
        BLOCKS_CHUNK=max(16, min(next_pow2(blocks), BLOCKS_BUDGET // e_pow2)),
        num_warps=8 if n > 2048 else 4,
    )
    return AlignedEntries(sorted_ids, block_expert, block_m)
