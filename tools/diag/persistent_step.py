"""Could a batch-1 decode step run in about 4 ms as one persistent kernel (a "megakernel")?

persistent_mlp.py put the MLP halves of 32 layers in one launch. This puts whole layers in
it, attention included, for one request: per layer, six phases with a grid-wide barrier
after each (persistent_mlp.py's products, norm, barrier and zeroing):
  A  RMSNorm of (residual + the last down output), the qkv product
  B  the residual updated; per (KV head, split of the context): rotary on q and the new k,
     scores against the cached keys and the new one, softmax partials; the new k and v
     stored in the cache at the request's position
  C  the splits combined, per query head
  D  the o product
  E  RMSNorm of (residual + o's output), the gate_up product
  F  the residual updated; SiLU-mul on the fly, the down product
Products accumulate in float32 with atomics, their input made on the fly as in
persistent_mlp.py; Triton pipelines the weight loads. The KV pool is [layers, rows, KV heads,
head dim], the engine's per-layer pools stacked; the request's tokens sit at the pool rows its
table row names, scattered. The LM head (cuBLAS, with the final norm) is timed apart, in a
graph.

It prints the kernel's ms for 32 layers, the LM head's, their sum next to the batch-1 target
(4.2 ms), and the kernel's error against float64 torch on two layers. GPU only, one program an
SM, launched cooperatively; the CPU test runs a one-program grid of small shapes.

    python3 tools/diag/persistent_step.py [--configs 128x128x8x3] [--context 1024] [--splits 16]

A config is BN x BK x warps x stages. Figures: docs/benchmarks.md, r93.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
import triton
import triton.language as tl

from tools.diag.persistent_mlp import _barrier, _gemv, _rstd, _zero

EPS = 1e-5


@triton.jit
def _add_into(dst_ptr, src_ptr, n, pid, ZB: tl.constexpr):
    """dst += src over this program's slice, then src = 0 (its readers are past a barrier)."""
    offs = pid * ZB + tl.arange(0, ZB)
    m = offs < n
    v = tl.load(dst_ptr + offs, mask=m, cache_modifier=".cg") + tl.load(src_ptr + offs, mask=m, cache_modifier=".cg")
    tl.store(dst_ptr + offs, v, mask=m)
    tl.store(src_ptr + offs, tl.zeros([ZB], dtype=tl.float32), mask=m)


@triton.jit
def _attend_split(item, lay, qkv_ptr, kc_ptr, vc_ptr, slot_ptr, cs_ptr, pm_ptr, pl_ptr, pacc_ptr, pos, T, ROWS,
                  scale, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, S: tl.constexpr,
                  BT: tl.constexpr):  # fmt: skip
    """One (KV head, split) of attention for the one request at position pos (the new token).
    Token t's K and V are in pool row slot[t] of the layer's ROWS rows, as in the engine's pool."""
    G: tl.constexpr = HQ // HKV
    HALF: tl.constexpr = D // 2
    g = item // S
    sp = item % S
    t0 = sp * T
    offs_t = t0 + tl.arange(0, BT)
    cached = (offs_t < t0 + T) & (offs_t < pos)
    hd = tl.arange(0, HALF)
    dd = tl.arange(0, D)
    heads = g * G + tl.arange(0, G)
    c = tl.load(cs_ptr + hd)
    sn = tl.load(cs_ptr + HALF + hd)
    q1 = tl.load(qkv_ptr + heads[:, None] * D + hd[None, :], cache_modifier=".cg")
    q2 = tl.load(qkv_ptr + heads[:, None] * D + HALF + hd[None, :], cache_modifier=".cg")
    q1r = q1 * c[None, :] - q2 * sn[None, :]
    q2r = q2 * c[None, :] + q1 * sn[None, :]
    kb = HQ * D + g * D
    vb = HQ * D + HKV * D + g * D
    k1 = tl.load(qkv_ptr + kb + hd, cache_modifier=".cg")
    k2 = tl.load(qkv_ptr + kb + HALF + hd, cache_modifier=".cg")
    k1r = k1 * c - k2 * sn
    k2r = k2 * c + k1 * sn
    vn = tl.load(qkv_ptr + vb + dd, cache_modifier=".cg")
    slots = tl.load(slot_ptr + offs_t, mask=cached, other=0)
    rows = (lay * ROWS + slots) * (HKV * D) + g * D  # int64: lay is
    cm = cached[:, None] & (hd[None, :] >= 0)
    kk1 = tl.load(kc_ptr + rows[:, None] + hd[None, :], mask=cm, other=0.0).to(tl.float32)
    kk2 = tl.load(kc_ptr + rows[:, None] + HALF + hd[None, :], mask=cm, other=0.0).to(tl.float32)
    sc = tl.sum(q1r[:, None, :] * kk1[None, :, :], axis=2) + tl.sum(q2r[:, None, :] * kk2[None, :, :], axis=2)
    sc = tl.where(cached[None, :] & (heads[:, None] >= 0), sc * scale, float("-inf"))
    has_new = (pos + 0 * heads >= t0) & (pos + 0 * heads < t0 + T)
    s_new = (tl.sum(q1r * k1r[None, :], axis=1) + tl.sum(q2r * k2r[None, :], axis=1)) * scale
    s_new = tl.where(has_new, s_new, float("-inf"))
    m = tl.maximum(tl.max(sc, axis=1), s_new)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(sc - m_safe[:, None])
    p_new = tl.exp(s_new - m_safe)
    vv = tl.load(vc_ptr + rows[:, None] + dd[None, :], mask=cached[:, None] & (dd[None, :] >= 0), other=0.0)
    acc = tl.sum(p[:, :, None] * vv.to(tl.float32)[None, :, :], axis=1) + p_new[:, None] * vn[None, :]
    idx = heads * S + sp
    tl.store(pm_ptr + idx, m)
    tl.store(pl_ptr + idx, tl.sum(p, axis=1) + p_new)
    tl.store(pacc_ptr + idx[:, None] * D + dd[None, :], acc)
    if (pos >= t0) & (pos < t0 + T):  # this split holds the new token: store its k and v
        nrow = (lay * ROWS + tl.load(slot_ptr + pos)) * (HKV * D) + g * D
        tl.store(kc_ptr + nrow + hd, k1r.to(kc_ptr.dtype.element_ty))
        tl.store(kc_ptr + nrow + HALF + hd, k2r.to(kc_ptr.dtype.element_ty))
        tl.store(vc_ptr + nrow + dd, vn.to(vc_ptr.dtype.element_ty))


@triton.jit
def _combine(hq, pm_ptr, pl_ptr, pacc_ptr, ao_ptr, D: tl.constexpr, S: tl.constexpr):
    sidx = tl.arange(0, S)
    dd = tl.arange(0, D)
    ms = tl.load(pm_ptr + hq * S + sidx, cache_modifier=".cg")
    ls = tl.load(pl_ptr + hq * S + sidx, cache_modifier=".cg")
    accs = tl.load(pacc_ptr + (hq * S + sidx)[:, None] * D + dd[None, :], cache_modifier=".cg")
    w = tl.exp(ms - tl.max(ms, axis=0))
    out = tl.sum(w[:, None] * accs, axis=0) / tl.sum(w * ls, axis=0)
    tl.store(ao_ptr + hq * D + dd, out)


@triton.jit
def _step_kernel(wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, an_ptr, mn_ptr, kc_ptr, vc_ptr, slot_ptr, cs_ptr, resid_ptr,
                 d_ptr, qkv_ptr, pm_ptr, pl_ptr, pacc_ptr, ao_ptr, h_ptr, gu_ptr, cnt_ptr, err_ptr, L, pos, T, ROWS,
                 eps, scale, H: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, INTER: tl.constexpr,
                 S: tl.constexpr, BT: tl.constexpr, NPROG: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 STAGES: tl.constexpr, ZB: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    QKV: tl.constexpr = (HQ + 2 * HKV) * D
    n_qkv = (QKV // BN) * (H // BK)
    n_o = (H // BN) * (HQ * D // BK)
    n_gu = (2 * INTER // BN) * (H // BK)
    n_d = (H // BN) * (INTER // BK)
    for layer in range(L):
        base = layer * 6 * NPROG
        lay = tl.full([], 0, tl.int64) + layer
        # A: qkv = Wqkv @ rmsnorm(resid + d)
        rstd = _rstd(resid_ptr, d_ptr, eps, H)
        _gemv(pid, wqkv_ptr + lay * QKV * H, H, n_qkv, qkv_ptr, d_ptr, resid_ptr, an_ptr + lay * H, rstd, NPROG,
              0, INTER, BN, BK, STAGES, True)  # fmt: skip
        _barrier(cnt_ptr, err_ptr, base + NPROG)
        # B: resid += d (d = 0 for the next down); gate_up's sums zeroed; attention's splits
        _add_into(resid_ptr, d_ptr, H, pid, ZB)
        _zero(gu_ptr, 2 * INTER, pid, ZB)
        for item in range(pid, HKV * S, NPROG):
            _attend_split(item, lay, qkv_ptr, kc_ptr, vc_ptr, slot_ptr, cs_ptr, pm_ptr, pl_ptr, pacc_ptr, pos, T,
                          ROWS, scale, HQ, HKV, D, S, BT)  # fmt: skip
        _barrier(cnt_ptr, err_ptr, base + 2 * NPROG)
        # C: the splits combined; qkv's sums zeroed for the next layer
        for hq in range(pid, HQ, NPROG):
            _combine(hq, pm_ptr, pl_ptr, pacc_ptr, ao_ptr, D, S)
        _zero(qkv_ptr, QKV, pid, ZB)
        _barrier(cnt_ptr, err_ptr, base + 3 * NPROG)
        # D: h = Wo @ attention's output
        _gemv(pid, wo_ptr + lay * H * HQ * D, HQ * D, n_o, h_ptr, ao_ptr, resid_ptr, mn_ptr, 0.0, NPROG, 2, INTER,
              BN, BK, STAGES, True)  # fmt: skip
        _barrier(cnt_ptr, err_ptr, base + 4 * NPROG)
        # E: gu = Wgu @ rmsnorm(resid + h)
        rstd = _rstd(resid_ptr, h_ptr, eps, H)
        _gemv(pid, wgu_ptr + lay * 2 * INTER * H, H, n_gu, gu_ptr, h_ptr, resid_ptr, mn_ptr + lay * H, rstd, NPROG,
              0, INTER, BN, BK, STAGES, True)  # fmt: skip
        _barrier(cnt_ptr, err_ptr, base + 5 * NPROG)
        # F: resid += h (h = 0); d = Wd @ (silu(gate) * up)
        _add_into(resid_ptr, h_ptr, H, pid, ZB)
        _gemv(pid, wd_ptr + lay * H * INTER, INTER, n_d, d_ptr, gu_ptr, resid_ptr, mn_ptr, 0.0, NPROG, 1, INTER,
              BN, BK, STAGES, True)  # fmt: skip
        _barrier(cnt_ptr, err_ptr, base + 6 * NPROG)


@dataclass
class Weights:
    qkv: torch.Tensor  # [L, (HQ + 2 HKV) D, H]
    o: torch.Tensor  # [L, H, HQ D]
    gate_up: torch.Tensor  # [L, 2 I, H]
    down: torch.Tensor  # [L, H, I]
    attn_norm: torch.Tensor  # [L, H]
    mlp_norm: torch.Tensor  # [L, H]
    hq: int
    hkv: int


class Step:
    """The layers of one request's decode step at position pos in one launch."""

    def __init__(self, w: Weights, kc: torch.Tensor, vc: torch.Tensor, cfg: tuple[int, int, int, int], splits: int,
                 nprog: int = 0, cooperative: bool = False) -> None:  # fmt: skip
        self.w, self.kc, self.vc = w, kc, vc
        self.bn, self.bk, self.warps, self.stages = cfg
        self.splits, self.cooperative = splits, cooperative
        dev = kc.device
        self.nprog = nprog or torch.cuda.get_device_properties(dev).multi_processor_count
        self.hidden, self.inter, self.d = w.qkv.shape[2], w.down.shape[2], kc.shape[3]
        f = dict(device=dev, dtype=torch.float32)
        self.resid = torch.zeros(self.hidden, **f)
        self.dbuf = torch.zeros(self.hidden, **f)
        self.qkv = torch.zeros(w.qkv.shape[1], **f)
        self.pm = torch.zeros(w.hq * splits, **f)
        self.pl = torch.zeros(w.hq * splits, **f)
        self.pacc = torch.zeros(w.hq * splits * self.d, **f)
        self.ao = torch.zeros(w.hq * self.d, **f)
        self.h = torch.zeros(self.hidden, **f)
        self.gu = torch.zeros(2 * self.inter, **f)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=dev)
        self.err = torch.zeros(1, dtype=torch.int32, device=dev)
        self.zb = triton.next_power_of_2(-(-2 * self.inter // self.nprog))

    def __call__(self, x: torch.Tensor, cos_sin: torch.Tensor, slots: torch.Tensor, pos: int,
                 layers: int) -> torch.Tensor:  # fmt: skip
        """x [H] (the token's embedding), cos_sin [D] (cos | sin at pos), slots [>= pos + 1] int32
        (the request's table row: token t's pool row) -> the residual after the last layer [H]
        float32. Stores each layer's new k and v in pool row slots[pos]."""
        for t in (self.dbuf, self.qkv, self.h, self.gu, self.cnt):
            t.zero_()
        self.resid.copy_(x)
        tokens = -(-(pos + 1) // self.splits)
        _step_kernel[(self.nprog,)](
            self.w.qkv, self.w.o, self.w.gate_up, self.w.down, self.w.attn_norm, self.w.mlp_norm, self.kc, self.vc,
            slots, cos_sin, self.resid, self.dbuf, self.qkv, self.pm, self.pl, self.pacc, self.ao, self.h, self.gu,
            self.cnt, self.err, layers, pos, tokens, self.kc.shape[1], EPS, self.d**-0.5, H=self.hidden,
            HQ=self.w.hq, HKV=self.w.hkv, D=self.d, INTER=self.inter, S=self.splits,
            BT=triton.next_power_of_2(tokens), NPROG=self.nprog, BN=self.bn, BK=self.bk, STAGES=self.stages,
            ZB=self.zb, num_warps=self.warps, **({"launch_cooperative_grid": True} if self.cooperative else {}),
        )  # fmt: skip
        return self.resid + self.dbuf


def reference(w: Weights, kc: torch.Tensor, vc: torch.Tensor, x: torch.Tensor, cos_sin: torch.Tensor,
              slots: torch.Tensor, pos: int,
              layers: int) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:  # fmt: skip
    """float64: -> (the residual after the layers, each layer's new (k, v) [HKV, D])."""
    d_, half, g = kc.shape[3], kc.shape[3] // 2, w.hq // w.hkv
    c, s = cos_sin[:half].double(), cos_sin[half:].double()

    def rot(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t[..., :half], t[..., half:]
        return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], -1)

    def norm(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return v * torch.rsqrt(v.pow(2).mean() + EPS) * weight.double()

    r, new = x.double(), []
    for i in range(layers):
        qkv = w.qkv[i].double() @ norm(r, w.attn_norm[i])
        q = rot(qkv[: w.hq * d_].view(w.hq, d_))
        k = rot(qkv[w.hq * d_ : (w.hq + w.hkv) * d_].view(w.hkv, d_))
        v = qkv[(w.hq + w.hkv) * d_ :].view(w.hkv, d_)
        new.append((k, v))
        rows = slots[:pos].long()
        keys = torch.cat([kc[i, rows].double(), k[None]]).repeat_interleave(g, dim=1)  # [pos + 1, HQ, D]
        vals = torch.cat([vc[i, rows].double(), v[None]]).repeat_interleave(g, dim=1)
        p = torch.einsum("hd,thd->ht", q, keys).mul(d_**-0.5).softmax(-1)
        r = r + w.o[i].double() @ torch.einsum("ht,thd->hd", p, vals).reshape(-1)
        gu = w.gate_up[i].double() @ norm(r, w.mlp_norm[i])
        inter = gu.shape[0] // 2
        r = r + w.down[i].double() @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:])
    return r, new


def random_weights(layers: int, hidden: int, hq: int, hkv: int, d: int, inter: int, dtype: torch.dtype,
                   device: torch.device, seed: int = 0) -> Weights:  # fmt: skip
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device, generator=g) / math.sqrt(fan_in)).to(dtype)

    return Weights(
        qkv=randn(layers, (hq + 2 * hkv) * d, hidden, fan_in=hidden),
        o=randn(layers, hidden, hq * d, fan_in=hq * d),
        gate_up=randn(layers, 2 * inter, hidden, fan_in=hidden),
        down=randn(layers, hidden, inter, fan_in=inter),
        attn_norm=(1 + 0.1 * torch.randn(layers, hidden, device=device, generator=g)).to(dtype),
        mlp_norm=(1 + 0.1 * torch.randn(layers, hidden, device=device, generator=g)).to(dtype),
        hq=hq,
        hkv=hkv,
    )


def main() -> None:
    from services.worker.blas_choice import graph_ms
    from tools.bench_blas import copy_gbps

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="128x128x8x3,64x256x8x3")
    ap.add_argument("--context", type=int, default=1024, help="tokens with the new one")
    ap.add_argument("--splits", type=int, default=16)
    args = ap.parse_args()
    dev, bf, layers, pos = torch.device("cuda"), torch.bfloat16, 32, args.context - 1
    hidden, hq, hkv, d, inter, vocab = 4096, 32, 8, 128, 14336, 128256
    w = random_weights(layers, hidden, hq, hkv, d, inter, bf, dev)
    rows = 4 * args.context  # a pool larger than the request, its slots scattered over it
    kc = torch.randn(layers, rows, hkv, d, device=dev).to(bf)
    vc = torch.randn(layers, rows, hkv, d, device=dev).to(bf)
    slots = torch.randperm(rows, device=dev)[: args.context].to(torch.int32)
    theta = pos / 500000.0 ** (torch.arange(0, d, 2, device=dev).float() / d)
    cos_sin = torch.cat([theta.cos(), theta.sin()])
    x = torch.randn(hidden, device=dev)
    lm = (torch.randn(vocab, hidden, device=dev) / hidden**0.5).to(bf)
    final_norm = torch.ones(hidden, device=dev, dtype=bf)
    copy = copy_gbps() * 1e9
    weight_bytes = 2 * (w.qkv[0].numel() + w.o[0].numel() + w.gate_up[0].numel() + w.down[0].numel())
    kv_bytes = 2 * 2 * args.context * hkv * d
    xr = torch.randn(1, hidden, device=dev)

    def head() -> torch.Tensor:
        v = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + EPS)
        return (v.to(bf) * final_norm) @ lm.t()

    head_ms = graph_ms(head, 10)
    floor_ms = 1000 * (layers * (weight_bytes + kv_bytes) + lm.numel() * 2) / copy
    print(json.dumps({"copy_GBps": copy / 1e9, "layers_floor_ms": 1000 * layers * (weight_bytes + kv_bytes) / copy,
                      "step_floor_ms": floor_ms, "lm_head_ms": head_ms}), flush=True)  # fmt: skip
    new_row = int(slots[pos])
    k_before, v_before = kc[:2, new_row].clone(), vc[:2, new_row].clone()
    ref, new = reference(w, kc, vc, x, cos_sin, slots, pos, 2)
    for spec in args.configs.split(","):
        cfg = tuple(int(v) for v in spec.split("x"))
        step = Step(w, kc, vc, cfg, args.splits, cooperative=True)  # type: ignore[arg-type]
        kc[:2, new_row], vc[:2, new_row] = k_before, v_before
        got = step(x, cos_sin, slots, pos, 2)
        torch.cuda.synchronize()
        err = ((got.double() - ref).norm() / ref.norm()).item()
        k_err = max(((kc[i, new_row].double() - new[i][0]).abs().max().item()) for i in range(2))
        ms = graph_ms(lambda step=step: step(x, cos_sin, slots, pos, layers), 10)
        print(json.dumps({"config": spec, "layers_ms": ms, "step_estimate_ms": ms + head_ms, "target_ms": 4.2,
                          "rel_err_2_layers": err, "new_k_max_abs_err": k_err,
                          "barrier_timeouts": int(step.err.item())}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
