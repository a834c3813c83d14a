"""Shared checks for the decode_attention tests: run the kernel over pooled requests and compare
with float32 attention (the conftest fixtures pooled, reference and tol come in as arguments)."""

from __future__ import annotations

import torch

from services.worker.kernels.decode_attention import NewTokens, decode_attention, decode_scratch
from services.worker.models.layers.ops import RowNorm, TorchOps, scale_rows
from services.worker.models.layers.rope import cos_sin_table


def check(
    lens: list[int],
    hq: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    quantized: bool | str,
    num_splits: int,
    device: torch.device,
    pooled,
    reference,
    tol,
    fused: bool = False,
    rotary: bool = False,
    norm: bool = False,
    window: int = 0,
    softcap: float = 0.0,
    **config: int,
) -> None:
    """norm (with rotary): the new tokens come with a RowNorm, whose factor scales q, k and v.
    window, softcap: the sliding window and the logit soft cap (0: none)."""
    req = pooled(lens, hkv, d, dtype, quantized, device)
    bsz = len(lens)
    qkv = torch.randn(bsz, hq + 2 * hkv, d, device=device).to(dtype)
    q = qkv[:, :hq]  # a strided view, as from qkv
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = torch.full((bsz, hq, d), float("nan"), dtype=dtype, device=device)
    mid_o, mid_lse = _poisoned_scratch(bsz, hq, d, num_splits, device)
    scale = d**-0.5
    keys, values, rq, new = req.keys, req.values, q, None
    if rotary:  # the new tokens as projected: the kernel rotates q and k and stores k and v
        row_norm = _row_norm(bsz, dtype, device) if norm else None
        new, rq, keys, values = new_tokens(req, qkv, lens, hq, hkv, row_norm)
    before = qkv.clone()
    # fused: the last split of each (request, KV head) combines them, counting here (left zero)
    counts = torch.zeros(bsz * hkv + 3, dtype=torch.int32, device=device) if fused else None
    config = {"window": window, "softcap": softcap, **config}
    for _ in range(2 if fused else 1):  # the second launch finds the counts as the first left them
        _launch(req, q, seq_lens, scale, num_splits, out, (mid_o, mid_lse), counts, new, config)
        _assert_outputs(out, lens, rq, keys, values, (scale, window, softcap), dtype, reference, tol)
        if counts is not None:
            assert not counts.any()
        out.fill_(float("nan"))
    assert torch.equal(qkv, before)  # q, k and v are read, never written
    if new is not None:
        _assert_stored(req, new, seq_lens, keys, values, norm, dtype, tol)
    if num_splits == 1:  # one split: stage 1 writes the output, and the scratch stays as it was
        assert mid_o.isnan().all() and mid_lse.isnan().all()


def _launch(req, q, seq_lens, scale: float, num_splits: int, out, scratch, counts, new, config: dict) -> None:
    """decode_attention over req's pool into out, with the given split scratch (mid_o, mid_lse)."""
    decode_attention(
        q,
        req.k_pool,
        req.v_pool,
        req.req_table,
        req.rows,
        seq_lens,
        scale,
        num_splits,
        out=out,
        k_scale=req.k_scale,
        v_scale=req.v_scale,
        mid_o=scratch[0],
        mid_lse=scratch[1],
        counts=counts,
        new=new,
        **config,
    )


def _poisoned_scratch(
    bsz: int, hq: int, d: int, num_splits: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split scratch filled with NaN: splits the reduce should ignore hold NaN."""
    mid_o, mid_lse = decode_scratch(bsz, hq, d, num_splits, device)
    mid_o.fill_(float("nan"))
    mid_lse.fill_(float("nan"))
    return mid_o, mid_lse


def _row_norm(bsz: int, dtype: torch.dtype, device: torch.device) -> RowNorm:
    """A residual whose rows' RMS runs from 0.2 to 5, 40 wide."""
    spread = torch.linspace(0.2, 5.0, bsz, device=device)[:, None]
    return RowNorm((torch.randn(bsz, 40, device=device) * spread).to(dtype), 1e-5)


def _assert_outputs(out, lens: list[int], rq, keys, values, attn: tuple, dtype: torch.dtype, reference, tol) -> None:
    """Each request's output is float32 attention (attn: scale, window, softcap) over its keys and
    values; an empty one's zeros."""
    for b, n in enumerate(lens):
        if n == 0:  # an empty request (a padded graph row): zeros
            assert torch.equal(out[b], torch.zeros_like(out[b]))
            continue
        ref = reference(rq[b : b + 1], keys[b], values[b], n - 1, *attn)[0]
        torch.testing.assert_close(out[b], ref.to(dtype), **tol(dtype), msg=lambda m, b=b: f"request {b}: {m}")


def _assert_stored(req, new: NewTokens, seq_lens, keys, values, norm: bool, dtype: torch.dtype, tol) -> None:
    """Each new token's k (rotated) and v went to its slot, and nothing else changed."""
    stored = new.slots[seq_lens > 0].long()
    torch.testing.assert_close(req.k_pool[stored], torch.stack([k[-1] for k in keys if len(k)]), **tol(dtype))
    stored_v = torch.stack([v[-1] for v in values if len(v)])
    if norm:  # the kernel's inverse RMS, summed in its own order, may round a v differently
        torch.testing.assert_close(req.v_pool[stored], stored_v, **tol(dtype))
    else:
        assert torch.equal(req.v_pool[stored], stored_v)
    assert req.k_pool[new.slots[seq_lens == 0].long()].isnan().all()


def new_tokens(req, qkv: torch.Tensor, lens: list[int], hq: int, hkv: int, norm: RowNorm | None = None):
    """Make each request's last token a new one: its pool slot emptied (NaN), its k and v the
    unrotated qkv rows (to be scaled by norm's factor first, given one). -> (NewTokens, q
    rotated, the keys and values the kernel should see)."""
    device, d = qkv.device, qkv.shape[-1]
    cos_sin = cos_sin_table(d, 500000.0, {}, max(lens) + 8, device)
    positions = torch.tensor([max(n - 1, 0) for n in lens], dtype=torch.int64, device=device)
    slots = req.req_table[req.rows.long(), positions].clone()  # where the table says the new token sits
    free = req.k_pool.flatten(1).isnan().all(1).nonzero()[0].to(torch.int32)  # a slot no request uses
    slots[torch.tensor(lens, device=device) == 0] = free  # an empty request's (never written)
    k_new, v_new = qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    rq, rk, rv = qkv[:, :hq].clone(), k_new.clone(), v_new
    if norm is not None:
        r = norm.inv_rms()
        rq, rk, rv = scale_rows(rq, r), scale_rows(rk, r), scale_rows(v_new, r)
    TorchOps().rotary_(rq, rk, positions, cos_sin)
    keys, values = [], []
    for b, n in enumerate(lens):
        if n > 0:
            req.k_pool[slots[b].long()] = float("nan")
            req.v_pool[slots[b].long()] = float("nan")
        keys.append(torch.cat([req.keys[b][: n - 1], rk[b : b + 1]]) if n else req.keys[b])
        values.append(torch.cat([req.values[b][: n - 1], rv[b : b + 1]]) if n else req.values[b])
    return NewTokens(k_new, v_new, cos_sin, slots, norm), rq, keys, values
