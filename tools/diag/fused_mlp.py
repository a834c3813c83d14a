"""Would a layer's MLP half in one kernel, with no barrier inside, beat cuBLAS's chain at small batches?

A folded decode layer's MLP half is three kernels: gate_up (cuBLAS), silu_mul (which applies the
MLP norm's factor) and down (cuBLAS, adding into the residual). r128 timed the three at 93.4 µs a
layer at batch 1, against 82.6 µs for their 352 MB at the copy rate. r83-r92's persistent kernel
kept the products apart with grid-wide barriers. This one needs none: program p owns a run of the
intermediate features, computes their gate and up rows in full (so their SiLU-mul is its own),
and multiplies them by the same run of down's input columns, a partial of the whole down
product; the partials are added into a float32 row with atomics, and the program that counts in
last adds that row into the residual and zeroes it for the next launch. Each weight byte is read
once, by one program, in one stream of loads per phase.

down is read transposed ([I, H], each program's run contiguous). Sums are added in whatever order
the atomics land, so the result is not bitwise the same from run to run.

    python3 tools/diag/fused_mlp.py [--batches 1,2,4] [--configs 128x64x64x8x3x128xdot,...]

A config is BN x BK x BH x warps x stages x programs x mode (dot: tl.dot with the batch padded to
16; ew: elementwise, batch 1 only). It prints, per batch and config, µs a layer of the kernel and
of the chain (32 layers with their own weights, one graph), the bytes' time at the copy rate,
and the kernel's error against float64 torch on two layers next to the chain's.
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

H, INTER, LAYERS, EPS, UNIT = 4096, 14336, 32, 1e-5, 16


@triton.jit
def _silu_mul_rows(g, u, r, dtype: tl.constexpr):
    """silu(gate * r) * (up * r), rounded as the chain rounds it (the product's output, each
    scaled value, the SiLU and the product each rounded to dtype)."""
    gate = (g.to(dtype).to(tl.float32) * r).to(dtype).to(tl.float32)
    up = (u.to(dtype).to(tl.float32) * r).to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


@triton.jit
def _fused_mlp_kernel(res_ptr, gu_ptr, dt_ptr, acc_ptr, cnt_ptr, T, eps, H: tl.constexpr, INTER: tl.constexpr,
                      UNIT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr,
                      FB: tl.constexpr, STAGES: tl.constexpr, DOT: tl.constexpr, PHASE: tl.constexpr = 0,
                      ATOMIC: tl.constexpr = True):  # fmt: skip
    """res [T, H] += down(silu_mul(gate_up(res) * r)) for this program's run of intermediate
    features; gu [2 I, H] (the MLP norm folded in), dt [I, H] (down transposed), acc [T, H]
    float32 zeros, cnt an int32 zero (both left so). For timing the parts apart (wrong results):
    PHASE 1 skips down's loop, PHASE 2 gate_up's; ATOMIC False stores the partials instead."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    units = INTER // UNIT
    u0 = pid * units // nprog
    u1 = (pid + 1) * units // nprog
    lanes = tl.arange(0, BN)
    live = lanes < (u1 - u0) * UNIT
    rows = (u0 * UNIT + lanes).to(tl.int64)
    dtype = res_ptr.dtype.element_ty
    g_rows = gu_ptr + rows[:, None] * H
    u_rows = gu_ptr + (rows + INTER)[:, None] * H
    d_rows = dt_ptr + rows[:, None] * H
    if DOT:
        tt = tl.arange(0, BT)
        tlive = tt < T
        g = tl.zeros([BN, BT], dtype=tl.float32)
        u = tl.zeros([BN, BT], dtype=tl.float32)
        ss = tl.zeros([BK, BT], dtype=tl.float32)
        for k in tl.range(0, H if PHASE != 2 else 0, BK, num_stages=STAGES):
            ks = k + tl.arange(0, BK)
            wg = tl.load(g_rows + ks[None, :], mask=live[:, None], other=0.0)
            wu = tl.load(u_rows + ks[None, :], mask=live[:, None], other=0.0)
            x = tl.load(res_ptr + tt[None, :] * H + ks[:, None], mask=tlive[None, :], other=0.0)  # [BK, BT]
            g = tl.dot(wg, x, g)
            u = tl.dot(wu, x, u)
            xf = x.to(tl.float32)
            ss += xf * xf
        r = tl.rsqrt(tl.sum(ss, axis=0) / H + eps)  # [BT]
        a = tl.trans(_silu_mul_rows(g, u, r[None, :], dtype))  # [BT, BN]
        if PHASE == 1:
            keep = tlive[:, None] & live[None, :]  # a's values kept, so the loop before is not cut
            tl.store(acc_ptr + pid + tt[:, None] + lanes[None, :], a.to(tl.float32), mask=keep)
        for h in tl.range(0, H if PHASE != 1 else 0, BH, num_stages=STAGES):
            hs = h + tl.arange(0, BH)
            wd = tl.load(d_rows + hs[None, :], mask=live[:, None], other=0.0)
            y = tl.dot(a, wd)  # [BT, BH]
            if ATOMIC:
                tl.atomic_add(acc_ptr + tt[:, None] * H + hs[None, :], y, mask=tlive[:, None], sem="relaxed",
                              scope="gpu")  # fmt: skip
            else:
                tl.store(acc_ptr + tt[:, None] * H + hs[None, :], y, mask=tlive[:, None])
    else:  # one row
        g2 = tl.zeros([BN, BK], dtype=tl.float32)
        u2 = tl.zeros([BN, BK], dtype=tl.float32)
        ss = tl.zeros([BK], dtype=tl.float32)
        for k in tl.range(0, H, BK, num_stages=STAGES):
            ks = k + tl.arange(0, BK)
            wg = tl.load(g_rows + ks[None, :], mask=live[:, None], other=0.0)
            wu = tl.load(u_rows + ks[None, :], mask=live[:, None], other=0.0)
            x = tl.load(res_ptr + ks).to(tl.float32)
            g2 += wg.to(tl.float32) * x[None, :]
            u2 += wu.to(tl.float32) * x[None, :]
            ss += x * x
        r = tl.rsqrt(tl.sum(ss, axis=0) / H + eps)
        a = _silu_mul_rows(tl.sum(g2, axis=1), tl.sum(u2, axis=1), r, dtype).to(tl.float32)  # [BN]
        for h in tl.range(0, H, BH, num_stages=STAGES):
            hs = h + tl.arange(0, BH)
            wd = tl.load(d_rows + hs[None, :], mask=live[:, None], other=0.0)
            tl.atomic_add(acc_ptr + hs, tl.sum(wd.to(tl.float32) * a[:, None], axis=0), sem="relaxed", scope="gpu")
    # every thread's adds are made before the count is; the program that counts last sees them all
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == nprog - 1:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
        offs = tl.arange(0, FB)
        for t in range(T):
            for c in tl.static_range(0, H, FB):
                p = acc_ptr + t * H + c + offs
                s = tl.load(p, cache_modifier=".cg")
                q = res_ptr + t * H + c + offs
                tl.store(q, (tl.load(q).to(tl.float32) + s).to(dtype))
                tl.store(p, tl.zeros([FB], dtype=tl.float32))


def fused_mlp(res: torch.Tensor, gu: torch.Tensor, dt: torch.Tensor, acc: torch.Tensor, cnt: torch.Tensor,
              cfg: dict, eps: float = EPS) -> None:  # fmt: skip
    """res [T, H] += the MLP half of a folded layer, in place (see the kernel)."""
    t, h = res.shape
    inter = dt.shape[0]
    assert gu.shape == (2 * inter, h) and dt.shape == (inter, h) and acc.shape[1] == h and acc.shape[0] >= t
    assert inter % UNIT == 0 and cfg["bn"] >= triton.cdiv(inter // UNIT, cfg["programs"]) * UNIT
    assert cfg["dot"] or t == 1, "the elementwise mode takes one row"
    assert t <= 16
    _fused_mlp_kernel[(cfg["programs"],)](
        res, gu, dt, acc, cnt, t, eps, H=h, INTER=inter, UNIT=UNIT, BN=cfg["bn"], BK=cfg["bk"], BH=cfg["bh"],
        BT=16, FB=min(1024, h), STAGES=cfg["stages"], DOT=cfg["dot"], PHASE=cfg.get("phase", 0),
        ATOMIC=cfg.get("atomic", True), num_warps=cfg["warps"],
    )  # fmt: skip


def parse_config(text: str) -> dict:
    """BN x BK x BH x warps x stages x programs x mode [x phase x atomic]."""
    bn, bk, bh, warps, stages, programs, mode, *more = text.split("x")
    phase, atomic = (int(more[0]), bool(int(more[1]))) if more else (0, True)
    return {"name": text, "bn": int(bn), "bk": int(bk), "bh": int(bh), "warps": int(warps), "stages": int(stages),
            "programs": int(programs), "dot": mode == "dot", "phase": phase, "atomic": atomic}  # fmt: skip


def reference(res: torch.Tensor, gu: torch.Tensor, down: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The folded MLP half in float64: res + down(silu(gate * r) * (up * r))."""
    x = res.double()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    y = x @ gu.double().t() * r
    inter = down.shape[1]
    return x + (torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]) @ down.double().t()


def main() -> None:
    from services.worker.blas_choice import graph_ms, matmul
    from services.worker.kernels.silu_mul import silu_mul
    from services.worker.ops import RowNorm
    from tools.bench_blas import copy_gbps

    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--configs", default="128x64x64x8x3x128xdot,128x64x64x8x3x128xew,128x128x64x8x3x128xdot")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    gen = [
        (torch.randn(2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02,
         torch.randn(H, INTER, device=dev, dtype=torch.bfloat16) * 0.02)
        for _ in range(LAYERS)
    ]  # fmt: skip
    dts = [d.t().contiguous() for _, d in gen]
    acc = torch.zeros(16, H, device=dev, dtype=torch.float32)
    cnt = torch.zeros(1, device=dev, dtype=torch.int32)
    gbps = copy_gbps()
    bytes_layer = (3 * INTER * H) * 2
    floor_us = bytes_layer / gbps / 1e3
    configs = [parse_config(c) for c in args.configs.split(",")]
    for batch in [int(b) for b in args.batches.split(",")]:
        res0 = torch.randn(batch, H, device=dev, dtype=torch.bfloat16)
        res = res0.clone()

        def chain(res=res):
            for gu, down in gen:
                a = silu_mul(matmul(res, gu), norm=RowNorm(res, EPS))
                matmul(a, down, res, accumulate=True)

        def fused(res=res, cfg=None):
            for (gu, _), dt in zip(gen, dts, strict=True):
                fused_mlp(res, gu, dt, acc, cnt, cfg)

        # errors on two layers against float64
        ref = reference(reference(res0, *gen[0]).to(torch.bfloat16), *gen[1])
        scale = ref.abs().max().item()
        res.copy_(res0)
        for gu, down in gen[:2]:
            a = silu_mul(matmul(res, gu), norm=RowNorm(res, EPS))
            matmul(a, down, res, accumulate=True)
        chain_err = (res.double() - ref).abs().max().item() / scale
        rows = []
        for rnd in range(args.rounds):
            chain_us = graph_ms(chain) * 1e3 / LAYERS
            rows.append({"batch": batch, "round": rnd, "what": "chain", "us_layer": round(chain_us, 2),
                         "bytes_us": round(floor_us, 2), "err": chain_err})  # fmt: skip
            a_in = silu_mul(matmul(res, gen[0][0]), norm=RowNorm(res, EPS))
            parts = {
                "cublas gate_up": (lambda res=res: [matmul(res, gu) for gu, _ in gen], 2 / 3),
                "cublas down": (lambda r=res, a=a_in: [matmul(a, d, r, accumulate=True) for _, d in gen], 1 / 3),
            }
            for what, (fn, share) in parts.items():
                us = graph_ms(fn) * 1e3 / LAYERS
                rows.append({"batch": batch, "round": rnd, "what": what, "us_layer": round(us, 2),
                             "bytes_us": round(floor_us * share, 2)})  # fmt: skip
            for cfg in configs:
                if not cfg["dot"] and batch != 1:
                    continue
                try:
                    rows.append(time_fused(cfg, batch, rnd, res, res0, ref, scale, floor_us, gen, dts, acc, cnt, fused))
                except Exception as e:  # a config that does not compile (shared memory) or launch
                    rows.append({"batch": batch, "round": rnd, "what": cfg["name"], "failed": str(e)[-700:]})
        for row in rows:
            print(json.dumps(row), flush=True)


def time_fused(cfg, batch, rnd, res, res0, ref, scale, floor_us, gen, dts, acc, cnt, fused) -> dict:
    """One config at one batch: its error on two layers against float64, then µs a layer over 32."""
    from services.worker.blas_choice import graph_ms

    res.copy_(res0)
    acc.zero_()  # a config timing its parts apart leaves it dirty
    for (gu, _), dt in zip(gen[:2], dts[:2], strict=True):
        fused_mlp(res, gu, dt, acc, cnt, cfg)
    torch.cuda.synchronize()
    err = (res.double() - ref).abs().max().item() / scale
    us = graph_ms(lambda: fused(cfg=cfg)) * 1e3 / LAYERS
    return {"batch": batch, "round": rnd, "what": cfg["name"], "us_layer": round(us, 2), "bytes_us": round(floor_us, 2),
            "err": err, "cnt_left": int(cnt.item()), "acc_left": float(acc.abs().max().item())}  # fmt: skip


if __name__ == "__main__":
    main()
