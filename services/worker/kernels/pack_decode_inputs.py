"""A decode step's input tensors, written by one kernel from one packed copy of the host's lists.

Built with PyTorch ops, a decode step's inputs took about 20 small copies and index kernels
outside its CUDA graph, each with its launch gap: 80 µs a step at batch 1 on an
H200. Here the host sends one [4, n] int64 array (each request's input token, its position,
its request-table row and its rotary offset) and this kernel writes the six inputs the model reads:
- input ids: the token, or, where the token is still in flight (-1 - j), row j of the previous
  step's sampled tokens, read on the device;
- positions, and sequence lengths (position + 1, the new token included);
- KV slots (from the allocator's [n] int32) and table rows, as int32;
- rotary positions: position + offset, where rotary turns the new token's q and k (M-RoPE's
  decodes turn by their request's delta, models/qwen2_vl.py; every other request's offset is 0).
It also records each new token's slot in the request table (table[row, position] = slot), which
otherwise took a host copy and an index kernel of its own a step.
Lanes from n up to the outputs' width are padding: token 0 at position 0 (rotary position 0),
the pool's scratch slot and the table's scratch row, length 1, as the decode graphs' padded rows expect.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from services.worker.kernels.launch import cdiv, launcher

BLOCK = 512
# what the kernel writes, in order
OUTPUTS = {
    "input_ids": torch.int64,
    "positions": torch.int64,
    "out_slots": torch.int32,
    "rows": torch.int32,
    "seq_lens": torch.int32,
    "rotary_positions": torch.int64,
}


@triton.jit(do_not_specialize=["n", "width", "table_stride", "dummy_slot", "dummy_row"])
def _decode_inputs_kernel(
    pack_ptr,
    prev_ptr,
    slots_ptr,
    table_ptr,
    ids_ptr,
    pos_ptr,
    out_slots_ptr,
    rows_ptr,
    lens_ptr,
    rot_ptr,
    n,
    width,
    table_stride,
    dummy_slot,
    dummy_row,
    HAS_PREV: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lane = offs < width
    real = offs < n
    tok = tl.load(pack_ptr + offs, mask=real, other=0)
    pos = tl.load(pack_ptr + n + offs, mask=real, other=0)
    row = tl.load(pack_ptr + 2 * n + offs, mask=real, other=dummy_row)
    offset = tl.load(pack_ptr + 3 * n + offs, mask=real, other=0)
    if HAS_PREV:
        pending = real & (tok < 0)
        prev = tl.load(prev_ptr + (-1 - tok), mask=pending, other=0)
        tok = tl.where(pending, prev, tok)
    slot = tl.load(slots_ptr + offs, mask=real, other=dummy_slot)
    tl.store(table_ptr + row * table_stride + pos, slot, mask=real)
    tl.store(ids_ptr + offs, tok, mask=lane)
    tl.store(pos_ptr + offs, pos, mask=lane)
    tl.store(out_slots_ptr + offs, slot.to(tl.int32), mask=lane)
    tl.store(rows_ptr + offs, row.to(tl.int32), mask=lane)
    tl.store(lens_ptr + offs, tl.where(real, pos + 1, 1).to(tl.int32), mask=lane)
    tl.store(rot_ptr + offs, pos + offset, mask=lane)


_launch = launcher(_decode_inputs_kernel)


def _check(
    pack: torch.Tensor, prev: torch.Tensor | None, slots: torch.Tensor, table: torch.Tensor, out: Sequence[torch.Tensor]
) -> None:
    if pack.dim() != 2 or pack.shape[0] != 4 or pack.dtype != torch.int64 or not pack.is_contiguous():
        raise ValueError(f"decode_inputs: pack must be a contiguous [4, n] int64, got {tuple(pack.shape)} {pack.dtype}")
    n = pack.shape[1]
    if slots.shape != (n,) or slots.dtype != torch.int32 or not slots.is_contiguous():
        raise ValueError(
            f"decode_inputs: slots must be a contiguous [{n}] int32, got {tuple(slots.shape)} {slots.dtype}"
        )
    if prev is not None and (prev.dim() != 1 or prev.dtype != torch.int64 or not prev.is_contiguous()):
        raise ValueError(f"decode_inputs: prev must be a contiguous 1-d int64, got {tuple(prev.shape)} {prev.dtype}")
    if table.dim() != 2 or table.dtype != torch.int32 or table.stride(1) != 1 or table.device != pack.device:
        raise ValueError(
            f"decode_inputs: table must be a 2-d int32 with a contiguous last dim on {pack.device}, "
            f"got {tuple(table.shape)} {table.dtype} on {table.device}"
        )
    width = out[0].shape[0]
    if width < n:
        raise ValueError(f"decode_inputs: {n} requests do not fit outputs of width {width}")
    if len(out) != len(OUTPUTS):
        raise ValueError(f"decode_inputs: out must be {len(OUTPUTS)} tensors ({', '.join(OUTPUTS)}), got {len(out)}")
    for (name, dtype), t in zip(OUTPUTS.items(), out, strict=True):
        if t.shape != (width,) or t.dtype != dtype or not t.is_contiguous() or t.device != pack.device:
            raise ValueError(
                f"decode_inputs: {name} must be a contiguous [{width}] {dtype} on {pack.device}, "
                f"got {tuple(t.shape)} {t.dtype} on {t.device}"
            )


def decode_inputs(
    pack: torch.Tensor,
    prev: torch.Tensor | None,
    slots: torch.Tensor,
    table: torch.Tensor,
    out: Sequence[torch.Tensor],
    dummy_slot: int,
    dummy_row: int,
) -> None:
    """pack [4, n] int64 (token or -1 - j for prev[j], position, table row, rotary offset); prev
    [P] int64, the previous step's sampled tokens (None: no token is in flight); slots [n] int32; table the
    request table [rows, context] int32, whose rows and positions of pack must be in range. Writes
    the six tensors of out (OUTPUTS, [width] each), lanes past n as padding, and
    table[row, position] = slot for each request."""
    _check(pack, prev, slots, table, out)
    width = out[0].shape[0]
    if width == 0:
        return
    has_prev = prev is not None and prev.numel() > 0
    ids, positions, out_slots, rows, seq_lens, rotary_positions = out
    _launch[(cdiv(width, BLOCK),)](
        pack_ptr=pack,
        prev_ptr=prev if has_prev else pack,
        slots_ptr=slots,
        table_ptr=table,
        ids_ptr=ids,
        pos_ptr=positions,
        out_slots_ptr=out_slots,
        rows_ptr=rows,
        lens_ptr=seq_lens,
        rot_ptr=rotary_positions,
        n=pack.shape[1],
        width=width,
        table_stride=table.stride(0),
        dummy_slot=dummy_slot,
        dummy_row=dummy_row,
        HAS_PREV=has_prev,
        BLOCK=BLOCK,
        num_warps=4,
    )


def decode_inputs_reference(
    pack: torch.Tensor,
    prev: torch.Tensor | None,
    slots: torch.Tensor,
    table: torch.Tensor,
    out: Sequence[torch.Tensor],
    dummy_slot: int,
    dummy_row: int,
) -> None:
    """The same in PyTorch ops."""
    _check(pack, prev, slots, table, out)
    n = pack.shape[1]
    tok, pos, row, offset = pack
    if prev is not None and prev.numel() > 0:
        pending = tok < 0
        tok = torch.where(pending, prev[torch.where(pending, -1 - tok, 0)], tok)
    table[row, pos] = slots
    ids, positions, out_slots, rows, seq_lens, rotary_positions = out
    for t, pad, real in (
        (ids, 0, tok),
        (positions, 0, pos),
        (out_slots, dummy_slot, slots),
        (rows, dummy_row, row),
        (seq_lens, 1, pos + 1),
        (rotary_positions, 0, pos + offset),
    ):
        t.fill_(pad)
        t[:n] = real.to(t.dtype)
