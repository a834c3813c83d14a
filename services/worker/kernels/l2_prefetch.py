"""Ask L2 for a byte range of a tensor ahead of the kernel that reads it.

A one-row decode step is a chain of products, each reading its weights once from HBM, with
small kernels between them (norms, attention, SiLU-mul) during which HBM does little: at
batch 1 attention reads 4 MB a layer in about 9 µs, and each product spends about 4 µs over
its bytes at the copy rate starting and ending (r75). Launched on a second stream in the
decode graph, this kernel fills those gaps: it asks L2 (50 MB on the H200) for the next
product's weights, so that product reads part of them from L2.

Each lane of a program asks for one CHUNK-byte piece (the last one shorter) with Hopper's
bulk prefetch (``cp.async.bulk.prefetch.L2``, no data comes back, no completion to wait
for), or, with LINE, one ``prefetch.global.L2`` per 128-byte line of its piece. Either way
the kernel only issues the requests and ends; HBM keeps serving them after it. Nothing is
written, so a prefetch can never change a result: at worst it costs HBM time.

With RECORD the kernel issues nothing and writes each lane's (offset, size) instead: that is
how the CPU tests (TRITON_INTERPRET=1, where inline PTX cannot run) check that the pieces
cover the range exactly once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher

CHUNK = 4096  # bytes a lane asks for; a multiple of 16, as the bulk prefetch needs
LANES = 128  # lanes (threads) of a program: one warp group
LINE_BYTES = 128


@triton.jit
def _l2_prefetch_kernel(base_ptr, rec_ptr, start, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr,
                        LINE: tl.constexpr, RECORD: tl.constexpr):  # fmt: skip
    lane = tl.program_id(0).to(tl.int64) * LANES + tl.arange(0, LANES)
    off = lane * CHUNK  # from start
    size = tl.minimum(nbytes - off, CHUNK)
    live = off < nbytes
    if RECORD:
        tl.store(rec_ptr + 2 * lane, start + off, mask=live)
        tl.store(rec_ptr + 2 * lane + 1, size, mask=live)
    elif LINE:
        for line in tl.static_range(CHUNK // 128):
            _prefetch_line(base_ptr + start + off + line * 128, live & (line * 128 < size))
    else:
        _prefetch_bulk(base_ptr + start + off, size.to(tl.int32), live)


@triton.jit
def _prefetch_bulk(ptrs, sizes, mask):
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [ptrs, sizes, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _prefetch_line(ptrs, mask):
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


_l2_prefetch_launch = launcher(_l2_prefetch_kernel)


def prefetch_range(t: torch.Tensor, nbytes: int | None = None) -> tuple[int, int]:
    """-> (start, nbytes) of t's storage to ask for: its first nbytes (all of it when None or
    more), trimmed to whole 16-byte pieces from a 16-byte aligned start."""
    if not t.is_contiguous():
        raise ValueError(f"l2_prefetch: the tensor must be contiguous, got strides {t.stride()}")
    total = t.numel() * t.element_size()
    n = total if nbytes is None else max(0, min(nbytes, total))
    start = (-t.data_ptr()) % 16
    return start, max(0, n - start) // 16 * 16


def l2_prefetch(t: torch.Tensor, nbytes: int | None = None, line: bool = False,
                record: torch.Tensor | None = None, chunk: int = CHUNK) -> None:  # fmt: skip
    """Ask L2 for t's first nbytes (all of t when None), on the current stream. line: one
    prefetch per 128-byte line instead of bulk prefetches. record (int64 [2 * lanes], CPU tests):
    write each lane's (offset, size) there instead of issuing anything."""
    if chunk % 128 or chunk <= 0:
        raise ValueError(f"l2_prefetch: chunk must be a positive multiple of 128 bytes, got {chunk}")
    start, n = prefetch_range(t, nbytes)
    if n == 0:
        return
    if record is None and not t.is_cuda:
        raise ValueError("l2_prefetch: issuing prefetches needs a CUDA tensor (record= for the CPU tests)")
    base = t.view(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.view(-1)
    grid = (cdiv(cdiv(n, chunk), LANES),)
    if record is not None and record.numel() < 2 * grid[0] * LANES:
        raise ValueError(f"l2_prefetch: record needs {2 * grid[0] * LANES} int64 entries, got {record.numel()}")
    _l2_prefetch_launch[grid](base, record if record is not None else base, start, n, CHUNK=chunk, LANES=LANES,
                              LINE=bool(line), RECORD=record is not None, num_warps=LANES // 32)  # fmt: skip
