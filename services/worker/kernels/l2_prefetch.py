"""Asking L2 for a weight's bytes from inside another kernel (Hopper's bulk prefetch).

A batch-1 decode step leaves HBM nearly idle while decode attention runs (a few MB of KV
in about 10 µs), and the o projection right after it is bound by its first loads' latency
more than by its 34 MB (r61). A kernel that runs before it can name that weight and have
each of its programs ask L2 for a share: ``cp.async.bulk.prefetch.L2.global`` is fire and
forget, one instruction per thread, no registers held and no wait. A hint only: nothing
reads what it fetches, so results never depend on it.

The PTX needs sm_90; under TRITON_INTERPRET=1 a caller's constexpr switch keeps it untraced.
"""

from __future__ import annotations

import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv

ALIGN = 16  # the instruction's address and size granularity, bytes


@triton.jit
def prefetch_share(addr, share, chunk, total, LANES: tl.constexpr):
    """Program ``share``'s part of bytes [0, total) at device address addr (an int64): bytes
    [share * chunk, (share + 1) * chunk), chunk a multiple of ALIGN * LANES, split over LANES
    threads, one bulk prefetch each; nothing past total."""
    lane = tl.arange(0, LANES).to(tl.int64)
    sub = chunk // LANES
    start = share.to(tl.int64) * chunk + lane * sub
    size = tl.minimum(tl.maximum(total - start, 0), sub).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r",
        [addr + start, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def share_bytes(total: int, programs: int, lanes: int) -> int:
    """Bytes each of ``programs`` asks for so that together they cover total: a multiple of
    ALIGN * lanes (each lane's part ALIGN-aligned)."""
    step = ALIGN * lanes
    return cdiv(cdiv(total, max(programs, 1)), step) * step


def supported(device_capability: tuple[int, int]) -> bool:
    """Whether the bulk prefetch exists on a GPU of this compute capability (Hopper on)."""
    return device_capability >= (9, 0)
