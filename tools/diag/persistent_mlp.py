"""Would one persistent kernel per step beat cuBLAS's chain of products at batch 1?

At batch 1 each product costs about 4 µs over its bytes (r75) and each small kernel about
2 µs, whoever runs them: a layer's MLP half (o, add_rmsnorm, gate_up, silu_mul, down,
add_rmsnorm) is six launches, each starting from an idle HBM. This experiment runs the MLP
halves of 32 layers in ONE launch of a persistent kernel: one program per SM, each product a
split of its weights into equal runs of [BN, BK] tiles, one per program, accumulated into
float32 with atomics; a grid-wide barrier (a counter) between products; the RMSNorm and the
SiLU-mul done by each program on the fly as it reads the product's input. Before a program
waits at a barrier it loads its first tile of the next product's weights, which no product
writes, so HBM is busy while the grid waits.

It prints, per config, the kernel's µs per layer next to the cuBLAS chain's (the model's own
kernels between the products) and the bytes' time at the copy rate, and the kernel's error
against float64 torch on two layers. The barrier spins until every program has come, so
the grid must be resident at once (one program per SM); under the interpreter, which runs
programs one after another, only a one-program grid can run (the CPU test does that).

    python3 tools/diag/persistent_mlp.py [--configs 64x256x8,64x256x8x1x0x1]

A config is BN x BK x warps [x depth (1, 2) x tiles prefetched into L2 ahead x 1 for the
barriers and norms alone, no products x programs per SM x 1 for weights loaded evict-first x
stages]. Depth 0 leaves the loads' pipelining to Triton (tl.range's num_stages = stages).
--cooperative launches the grid cooperatively: CUDA then refuses a grid that cannot all be
resident, instead of leaving its barriers waiting. Figures: docs/benchmarks.md, r83–r92.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch
import triton
import triton.language as tl

from services.worker.blas_choice import graph_ms
from services.worker.kernels.add_rmsnorm import add_rmsnorm_
from services.worker.kernels.silu_mul import silu_mul
from tools.bench_blas import copy_gbps

H, INTER, LAYERS, EPS = 4096, 14336, 32, 1e-5
SPIN_LIMIT = tl.constexpr(1 << 18)  # a barrier gives up (and flags it) rather than hang the GPU


@triton.jit
def _barrier(cnt_ptr, err_ptr, target):
    tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < SPIN_LIMIT):
        seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if spins >= SPIN_LIMIT:
        tl.atomic_add(err_ptr, 1)


@triton.jit
def _units(pid, NPROG: tl.constexpr, n_units):
    return pid * n_units // NPROG, (pid + 1) * n_units // NPROG


@triton.jit
def _tile(w_ptr, K, u, u_end, BN: tl.constexpr, BK: tl.constexpr, EVICT: tl.constexpr = False):
    """Tile u of w [N, K] (row tiles of BN, each split in K // BK tiles), zeros past u_end."""
    upr = K // BK
    rows = (u // upr) * BN + tl.arange(0, BN)
    ks = (u % upr) * BK + tl.arange(0, BK)
    ptrs = w_ptr + rows.to(tl.int64)[:, None] * K + ks[None, :]
    live = (u + 0 * rows[:, None] + 0 * ks[None, :]) < u_end  # a full-shape mask (the interpreter needs one)
    if EVICT:  # read once: let the weights leave L2 first
        return tl.load(ptrs, mask=live, other=0.0, eviction_policy="evict_first")
    return tl.load(ptrs, mask=live, other=0.0)


@triton.jit
def _prefetch_tiles(w_ptr, K, u, u_end, BN: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr):
    """Ask L2 for tiles u .. u + PF - 1 (those before u_end): one prefetch per 128-byte line."""
    for j in tl.static_range(PF):
        t = u + j
        upr = K // BK
        rows = (t // upr) * BN + tl.arange(0, BN)
        lines = (t % upr) * BK + tl.arange(0, BK // 64) * 64
        ptrs = w_ptr + rows.to(tl.int64)[:, None] * K + lines[None, :]
        live = (t + 0 * rows[:, None] + 0 * lines[None, :]) < u_end
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptrs, live.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


@triton.jit
def _rstd(r_ptr, v_ptr, eps, H: tl.constexpr):
    """1 / rms(r + v), both read from L2 (.cg): either may be written by other SMs in this launch."""
    offs = tl.arange(0, H)
    x = tl.load(r_ptr + offs, cache_modifier=".cg").to(tl.float32) + tl.load(v_ptr + offs, cache_modifier=".cg")
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)


@triton.jit
def _gemv(pid, w_ptr, K, n_units, out_ptr, xa_ptr, r_ptr, nw_ptr, rstd, NPROG: tl.constexpr, MODE: tl.constexpr,
          INTER: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
          EVICT: tl.constexpr):  # fmt: skip
    """out += w @ x over this program's run of tiles, Triton pipelining the weight loads STAGES
    deep; x = (r + xa) * rstd * nw (MODE 0), silu(xa[:INTER]) * xa[INTER:] (1) or xa (2). What
    this launch writes is read with .cg (L2), since L1 does not see other SMs' writes."""
    u0, u1 = _units(pid, NPROG, n_units)
    upr = K // BK
    lanes = tl.arange(0, BN)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    for u in tl.range(u0, u1, num_stages=STAGES):
        w = _tile(w_ptr, K, u, u1, BN, BK, EVICT)
        ks = (u % upr) * BK + tl.arange(0, BK)
        a = tl.load(xa_ptr + ks, cache_modifier=".cg")
        if MODE == 1:
            b = tl.load(xa_ptr + INTER + ks, cache_modifier=".cg")
            x = a / (1.0 + tl.exp(-a)) * b
        elif MODE == 0:
            r = tl.load(r_ptr + ks, cache_modifier=".cg").to(tl.float32)
            x = (a + r) * rstd * tl.load(nw_ptr + ks).to(tl.float32)
        else:
            x = a
        acc += w.to(tl.float32) * x[None, :]
        if ((u + 1) == u1) | ((u + 1) % upr == 0):  # the row tile's last tile in this run
            tl.atomic_add(out_ptr + (u // upr) * BN + lanes, tl.sum(acc, axis=1), sem="relaxed")
            acc = tl.zeros([BN, BK], dtype=tl.float32)


@triton.jit
def _x_in(u, u_end, K, xa_ptr, r_ptr, nw_ptr, SILU: tl.constexpr, INTER: tl.constexpr, BK: tl.constexpr):
    """The raw inputs of tile u's slice of x (zeros past u_end): (gate, up, -) with SILU, else (xa, r, nw)."""
    ks = (u % (K // BK)) * BK + tl.arange(0, BK)
    live = (u + 0 * ks) < u_end
    a = tl.load(xa_ptr + ks, mask=live, other=0.0, cache_modifier=".cg")
    if SILU:
        b = tl.load(xa_ptr + INTER + ks, mask=live, other=0.0, cache_modifier=".cg")
        c = b
    else:
        b = tl.load(r_ptr + ks, mask=live, other=0.0).to(tl.float32)
        c = tl.load(nw_ptr + ks, mask=live, other=0.0).to(tl.float32)
    return a, b, c


@triton.jit
def _product(pid, w_ptr, K, n_units, out_ptr, xa_ptr, r_ptr, nw_ptr, rstd, w_first, w_second,
             NPROG: tl.constexpr, SILU: tl.constexpr, INTER: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             DEPTH: tl.constexpr, PF: tl.constexpr, SYNC_ONLY: tl.constexpr, EVICT: tl.constexpr,
             STAGES: tl.constexpr):  # fmt: skip
    """out += w @ x over this program's run of tiles; x = rmsnorm(r + xa) * nw, or with SILU
    silu(xa[:INTER]) * xa[INTER:]. w_first, w_second: the run's first two tiles, loaded already
    (the second only with DEPTH 2; neither with DEPTH 0, where Triton pipelines the loads
    STAGES deep). Each tile's weights are loaded DEPTH tiles ahead, its x
    slice one ahead; the products add up in [BN, BK] and are summed over K only when a row
    tile's run ends. PF > 0: each tile's weights are asked of L2 PF tiles before the registers'
    load (the kernel asked for the first PF before its barrier)."""
    u0, u1 = _units(pid, NPROG, n_units)
    if SYNC_ONLY:  # time the barriers and norms alone
        u1 = u0
    upr = K // BK
    lanes = tl.arange(0, BN)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    if DEPTH == 0:  # Triton's own pipelining of the loads, STAGES deep
        _gemv(pid, w_ptr, K, 0 if SYNC_ONLY else n_units, out_ptr, xa_ptr, r_ptr, nw_ptr, rstd, NPROG,
              1 if SILU else 0, INTER, BN, BK, STAGES, EVICT)  # fmt: skip
    else:
        w_cur = w_first
        w_n1 = w_second
        a, b, c = _x_in(u0, u1, K, xa_ptr, r_ptr, nw_ptr, SILU, INTER, BK)
        for u in range(u0, u1):
            if PF > 0:
                _prefetch_tiles(w_ptr, K, u + 1 + PF, u1, BN, BK, 1)
            if DEPTH == 2:
                w_next = w_n1
                w_n1 = _tile(w_ptr, K, u + 2, u1, BN, BK, EVICT)
            else:
                w_next = _tile(w_ptr, K, u + 1, u1, BN, BK, EVICT)
            an, bn, cn = _x_in(u + 1, u1, K, xa_ptr, r_ptr, nw_ptr, SILU, INTER, BK)
            if SILU:
                x = a / (1.0 + tl.exp(-a)) * b
            else:
                x = (a + b) * rstd * c
            acc += w_cur.to(tl.float32) * x[None, :]
            if ((u + 1) == u1) | ((u + 1) % upr == 0):  # the row tile's last tile in this run
                tl.atomic_add(out_ptr + (u // upr) * BN + lanes, tl.sum(acc, axis=1), sem="relaxed")
                acc = tl.zeros([BN, BK], dtype=tl.float32)
            w_cur = w_next
            a, b, c = an, bn, cn


@triton.jit
def _load_ahead_then_wait(pid, w, K, n_units, cnt_ptr, err_ptr, target, NPROG: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr, DEPTH: tl.constexpr, PF: tl.constexpr):  # fmt: skip
    """Load this program's first tiles of the next product's weights (nothing writes them), ask
    L2 for PF more, then wait at the barrier for target arrivals. -> the tiles."""
    u0, u1 = _units(pid, NPROG, n_units)
    w_first = _tile(w, K, u0, u1, BN, BK)
    w_second = _tile(w, K, u0 + DEPTH - 1, u1, BN, BK)
    if PF > 0:
        _prefetch_tiles(w, K, u0 + 1, u1, BN, BK, PF)
    _barrier(cnt_ptr, err_ptr, target)
    return w_first, w_second


@triton.jit
def _zero(ptr, n, pid, ZB: tl.constexpr):
    offs = pid * ZB + tl.arange(0, ZB)
    tl.store(ptr + offs, tl.zeros([ZB], dtype=tl.float32), mask=offs < n)


@triton.jit
def _mlp_chain_kernel(wo_ptr, wgu_ptr, wd_ptr, r_ptr, nw_ptr, h_ptr, gu_ptr, d_ptr, cnt_ptr, err_ptr, L, eps,
                      H: tl.constexpr, INTER: tl.constexpr, NPROG: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, ZB: tl.constexpr, DEPTH: tl.constexpr, PF: tl.constexpr,
                      SYNC_ONLY: tl.constexpr, EVICT: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    n_o = (H // BN) * (H // BK)
    n_gu = (2 * INTER // BN) * (H // BK)
    n_d = (H // BN) * (INTER // BK)
    u0, u1 = _units(pid, NPROG, n_o)
    w_first = _tile(wo_ptr, H, u0, u1, BN, BK)
    w_second = _tile(wo_ptr, H, u0 + DEPTH - 1, u1, BN, BK)
    for layer in range(L):
        target = layer * 3 * NPROG
        lay = tl.full([], 0, tl.int64) + layer
        p = layer % 2
        wo = wo_ptr + lay * H * H
        wgu = wgu_ptr + lay * 2 * INTER * H
        wd = wd_ptr + lay * H * INTER
        hp = h_ptr + p * H
        gup = gu_ptr + p * 2 * INTER
        dp = d_ptr + p * H
        din = d_ptr + (1 - p) * H
        # o: h = Wo @ rmsnorm(r + d_in)
        rstd = _rstd(r_ptr, din, eps, H)
        _product(pid, wo, H, n_o, hp, din, r_ptr, nw_ptr, rstd, w_first, w_second, NPROG, False, INTER, BN, BK,
                 DEPTH, PF, SYNC_ONLY, EVICT, STAGES)  # fmt: skip
        w_first, w_second = _load_ahead_then_wait(pid, wgu, H, n_gu, cnt_ptr, err_ptr, target + NPROG, NPROG,
                                                  BN, BK, DEPTH, PF)  # fmt: skip
        # the other parity's accumulators are read by now: zero them for the next layer
        _zero(d_ptr + (1 - p) * H, H, pid, ZB)
        _zero(h_ptr + (1 - p) * H, H, pid, ZB)
        _zero(gu_ptr + (1 - p) * 2 * INTER, 2 * INTER, pid, ZB)
        # gate_up: gu = Wgu @ rmsnorm(r + h)
        rstd = _rstd(r_ptr, hp, eps, H)
        _product(pid, wgu, H, n_gu, gup, hp, r_ptr, nw_ptr, rstd, w_first, w_second, NPROG, False, INTER, BN, BK,
                 DEPTH, PF, SYNC_ONLY, EVICT, STAGES)  # fmt: skip
        w_first, w_second = _load_ahead_then_wait(pid, wd, INTER, n_d, cnt_ptr, err_ptr, target + 2 * NPROG,
                                                  NPROG, BN, BK, DEPTH, PF)  # fmt: skip
        # down: d = Wd @ (silu(gate) * up)
        _product(pid, wd, INTER, n_d, dp, gup, r_ptr, nw_ptr, 0.0, w_first, w_second, NPROG, True, INTER, BN, BK,
                 DEPTH, PF, SYNC_ONLY, EVICT, STAGES)  # fmt: skip
        nxt = wo_ptr + tl.minimum(lay + 1, L - 1) * H * H
        w_first, w_second = _load_ahead_then_wait(pid, nxt, H, n_o, cnt_ptr, err_ptr, target + 3 * NPROG, NPROG,
                                                  BN, BK, DEPTH, PF)  # fmt: skip


class Chain:
    def __init__(self, wo, wgu, wd, r, nw, cfg: tuple[int, ...], nprog: int = 0, cooperative: bool = False) -> None:
        self.wo, self.wgu, self.wd, self.r, self.nw = wo, wgu, wd, r, nw
        self.bn, self.bk, self.warps = cfg[:3]
        self.depth = cfg[3] if len(cfg) > 3 else 1
        self.pf = cfg[4] if len(cfg) > 4 else 0  # tiles asked of L2 ahead (inline PTX: GPU only)
        self.sync_only = bool(cfg[5]) if len(cfg) > 5 else False  # no products: the barriers' own cost
        dev = wo.device
        self.hidden, self.inter = wo.shape[1], wd.shape[2]
        per_sm = cfg[6] if len(cfg) > 6 else 1  # programs per SM (all must be resident at once)
        self.evict = bool(cfg[7]) if len(cfg) > 7 else False  # weights loaded evict-first
        self.stages = cfg[8] if len(cfg) > 8 else 2  # with depth 0: Triton pipelines the loads this deep
        self.cooperative = cooperative
        self.nprog = nprog or per_sm * torch.cuda.get_device_properties(dev).multi_processor_count
        self.h = torch.zeros(2, self.hidden, device=dev)
        self.gu = torch.zeros(2, 2 * self.inter, device=dev)
        self.d = torch.zeros(2, self.hidden, device=dev)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=dev)
        self.err = torch.zeros(1, dtype=torch.int32, device=dev)
        self.zb = triton.next_power_of_2(-(-2 * self.inter // self.nprog))

    def __call__(self, x: torch.Tensor, layers: int) -> torch.Tensor:
        """x [H] fp32 (the first layer's d_in) -> the last layer's down output [H] fp32."""
        self.h.zero_()
        self.gu.zero_()
        self.d[0].zero_()
        self.d[1].copy_(x)
        self.cnt.zero_()
        _mlp_chain_kernel[(self.nprog,)](self.wo, self.wgu, self.wd, self.r, self.nw, self.h, self.gu, self.d,
                                         self.cnt, self.err, layers, EPS, H=self.hidden, INTER=self.inter,
                                         NPROG=self.nprog, BN=self.bn, BK=self.bk, ZB=self.zb,
                                         DEPTH=self.depth, PF=self.pf, SYNC_ONLY=self.sync_only,
                                         EVICT=self.evict, STAGES=self.stages, num_warps=self.warps,
                                         **({"launch_cooperative_grid": True} if self.cooperative else {}))  # fmt: skip
        return self.d[(layers - 1) % 2]


def reference(wo, wgu, wd, r, nw, x, layers: int) -> torch.Tensor:
    d, inter = x.double(), wd.shape[2]
    rr, w = r.double(), nw.double()
    for i in range(layers):
        v = rr + d
        h = wo[i].double() @ (v * torch.rsqrt(v.pow(2).mean() + EPS) * w)
        v = rr + h
        gu = wgu[i].double() @ (v * torch.rsqrt(v.pow(2).mean() + EPS) * w)
        d = wd[i].double() @ (torch.nn.functional.silu(gu[:inter]) * gu[inter:])
    return d.float()


def cublas_chain(wo, wgu, wd, nw, d, residual) -> torch.Tensor:
    """The model's own MLP halves: add_rmsnorm, o, add_rmsnorm, gate_up, silu_mul, down."""
    for i in range(wo.shape[0]):
        a = add_rmsnorm_(d, residual, nw, EPS)
        h = a @ wo[i].t()
        a = add_rmsnorm_(h, residual, nw, EPS)
        d = silu_mul(a @ wgu[i].t()) @ wd[i].t()
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="64x256x8,32x256x8,64x256x8x1x0x0x1x1")
    ap.add_argument("--cooperative", action="store_true")
    args = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    wo = torch.randn(LAYERS, H, H, device=dev, dtype=bf, generator=g) / H**0.5
    wgu = torch.randn(LAYERS, 2 * INTER, H, device=dev, dtype=bf, generator=g) / H**0.5
    wd = torch.randn(LAYERS, H, INTER, device=dev, dtype=bf, generator=g) / INTER**0.5
    r = torch.randn(H, device=dev, dtype=bf, generator=g)
    nw = (1 + 0.1 * torch.randn(H, device=dev, generator=g)).to(bf)
    x = torch.randn(H, device=dev, generator=g)
    copy = copy_gbps() * 1e9
    per_layer_bytes = 2 * (H * H + 2 * INTER * H + H * INTER)
    residual = torch.zeros(1, H, device=dev, dtype=bf)
    x_bf = x.to(bf)[None]
    blas_us = graph_ms(lambda: cublas_chain(wo, wgu, wd, nw, x_bf, residual.clone()), 10) * 1000 / LAYERS
    print(json.dumps({"copy_GBps": copy / 1e9, "bytes_us_per_layer": per_layer_bytes / copy * 1e6,
                      "cublas_chain_us_per_layer": blas_us}), flush=True)  # fmt: skip
    ref = reference(wo, wgu, wd, r, nw, x, 2)
    for spec in args.configs.split(","):
        cfg = tuple(int(v) for v in spec.split("x"))
        chain = Chain(wo, wgu, wd, r, nw, cfg, cooperative=args.cooperative)
        try:
            got = chain(x, 2).clone()
        except Exception as e:  # a cooperative grid too large to be resident: say so, go on
            print(json.dumps({"config": spec, "error": str(e)[:200]}), flush=True)
            continue
        torch.cuda.synchronize()
        err = ((got - ref).norm() / ref.norm()).item() if not chain.sync_only else None
        us = graph_ms(lambda chain=chain: chain(x, LAYERS), 10) * 1000 / LAYERS
        print(json.dumps({"config": spec, "us_per_layer": us, "rel_err_2_layers": err,
                          "barrier_timeouts": int(chain.err.item())}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
