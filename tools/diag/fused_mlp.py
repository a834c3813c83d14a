"""A layer's MLP half in one kernel with no barrier inside, against cuBLAS's chain at small batches.

A folded decode layer's MLP half is ``residual += down(silu(gate * r) * (up * r))``, where
gate | up = gate_up @ residual (the MLP norm folded into gate_up) and r is the residual row's
inverse RMS. The worker runs it as three kernels: gate_up (cuBLAS), silu_mul (which applies r)
and down (cuBLAS, adding into the residual), each starting from an idle HBM.

Here program p owns the intermediate features [p BN, (p + 1) BN): it reads their gate and up rows
in full, so their SiLU-mul is its own, and multiplies the result by the same features of down,
which gives a partial sum of the whole down product. No program waits for another, and every
weight byte is read once. The partials are added into an int64 row in fixed point (2^-32), so
their sum does not depend on the order the atomics land in. The program that counts in last adds
that row into the residual (rounded once, as a GEMM adding into its output rounds) and zeroes it,
and the count, for the next launch. Rounding otherwise follows the chain: gate and up rounded to
the activations' dtype as a product's output is, then scaled and rounded, the SiLU and the
product each rounded, as silu_mul does.

Each point is 32 layers with their own weights, replayed from one CUDA graph; µs a layer, next to
the bytes' time at the copy rate measured in the same job, and each form's largest error against
float64 torch over two layers.

    python3 tools/diag/fused_mlp.py [--batches 1,2,4] [--configs 128x64x128x8x4,...]

A config is BLOCK_N x BLOCK_K x BLOCK_H x warps x stages [x t: down read transposed, [I, H]]
[x nofence]. The first form of this tool (a0b2707: down transposed, float32 atomics, the parts
timed apart) gave r130 and r131; this one r132 and r133. Figures in docs/benchmarks.md.
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

from services.worker.kernels.launch import launcher

H, INTER, LAYERS, EPS = 4096, 14336, 32, 1e-5
# fixed point of the partial sums: 2^-32 resolution, and |sum| up to 2^31 fits in an int64
SCALE = 2.0**32
BLOCK_T = 16  # rows a dot takes (the MMA's narrowest side); rows past the step's are masked off
# the kernel's tiles at the 8B shape, on an H200 (r132): features a program, hidden columns a
# gate_up tile, hidden rows a down tile, warps, and the loads' pipeline depth
BLOCK_N, BLOCK_K, BLOCK_H, WARPS, STAGES = 128, 64, 128, 8, 4


@triton.jit
def _silu_mul_tile(g, u, r, dtype: tl.constexpr):
    gate = (g.to(dtype).to(tl.float32) * r).to(dtype).to(tl.float32)
    up = (u.to(dtype).to(tl.float32) * r).to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


@triton.jit
def _fused_mlp_kernel(res_ptr, gu_ptr, down_ptr, acc_ptr, cnt_ptr, T, eps, H: tl.constexpr, INTER: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, BH: tl.constexpr, BT: tl.constexpr, FB: tl.constexpr,
                      STAGES: tl.constexpr, PRECISION: tl.constexpr, SCALE: tl.constexpr, DOWN_T: tl.constexpr,
                      FENCE: tl.constexpr):  # fmt: skip
    """res [T, H] += down(silu_mul(gate_up @ res * r)) over this program's BN features; gu
    [2 INTER, H], down [H, INTER] (DOWN_T: [INTER, H]), acc [BT, H] int64 zeros and cnt an int32
    zero (both left so)."""
    pid = tl.program_id(0)
    dtype = res_ptr.dtype.element_ty
    feats = (pid * BN + tl.arange(0, BN)).to(tl.int64)
    tt = tl.arange(0, BT)
    trow = tt < T
    g = tl.zeros([BN, BT], dtype=tl.float32)
    u = tl.zeros([BN, BT], dtype=tl.float32)
    ss = tl.zeros([BK, BT], dtype=tl.float32)
    for k in tl.range(0, H, BK, num_stages=STAGES):
        ks = k + tl.arange(0, BK)
        wg = tl.load(gu_ptr + feats[:, None] * H + ks[None, :])
        wu = tl.load(gu_ptr + (feats + INTER)[:, None] * H + ks[None, :])
        x = tl.load(res_ptr + tt[None, :] * H + ks[:, None], mask=trow[None, :], other=0.0)  # [BK, BT]
        g = tl.dot(wg, x, g, input_precision=PRECISION)
        u = tl.dot(wu, x, u, input_precision=PRECISION)
        xf = x.to(tl.float32)
        ss += xf * xf
    r = tl.rsqrt(tl.sum(ss, axis=0) / H + eps)  # [BT]
    a = tl.trans(_silu_mul_tile(g, u, r[None, :], dtype))  # [BT, BN]
    for h in tl.range(0, H, BH, num_stages=STAGES):
        hs = h + tl.arange(0, BH)
        if DOWN_T:
            wd = tl.load(down_ptr + feats[:, None] * H + hs[None, :])  # [BN, BH]
        else:
            wd = tl.trans(tl.load(down_ptr + hs.to(tl.int64)[:, None] * INTER + feats[None, :]))
        y = tl.dot(a, wd, input_precision=PRECISION)  # [BT, BH]
        tl.atomic_add(acc_ptr + tt[:, None] * H + hs[None, :], (y * SCALE).to(tl.int64), mask=trow[:, None],
                      sem="relaxed", scope="gpu")  # fmt: skip
    if FENCE:  # each thread releases its adds (adding zero with release semantics), before the barrier
        last = (H - BH) + tl.arange(0, BH)
        tl.atomic_add(acc_ptr + tt[:, None] * H + last[None, :], tl.zeros([BT, BH], dtype=tl.int64), sem="release",
                      scope="gpu")  # fmt: skip
    # every thread's adds are made before the count is (the barrier, then a release); the program
    # that counts last sees them all (acquire, and reads through L2)
    tl.debug_barrier()
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")  # ready for the next launch
        offs = tl.arange(0, FB)
        for t in range(T):
            for c in tl.static_range(0, H, FB):
                acc = acc_ptr + t * H + c + offs
                s = (tl.load(acc, cache_modifier=".cg").to(tl.float64) * (1.0 / SCALE)).to(tl.float32)
                row = res_ptr + t * H + c + offs
                tl.store(row, (tl.load(row).to(tl.float32) + s).to(dtype))
                tl.store(acc, tl.zeros([FB], dtype=tl.int64))


_fused_mlp_launch = launcher(_fused_mlp_kernel)


def _largest_pow2_divisor(n: int, cap: int) -> int:
    b = cap
    while b > 16 and n % b:
        b //= 2
    return b


class FusedMLP:
    """The MLP half of a folded layer for up to BLOCK_T rows, in place on the residual, with the
    scratch its launches share (one launch at a time: a stream's graphs replay one by one)."""

    def __init__(self, hidden: int, inter: int, eps: float, device: torch.device,
                 tiles: tuple[int, ...] = (BLOCK_N, BLOCK_K, BLOCK_H, WARPS, STAGES), down_t: bool = False,
                 fence: bool = True) -> None:  # fmt: skip
        """tiles: the most BLOCK_N, BLOCK_K and BLOCK_H may be (each the largest power of two that
        divides its size, up to that), then warps and stages; down_t: down comes transposed, [I, H];
        fence: every thread releases its atomics before the program counts in."""
        if not self.fits(hidden, inter):
            raise ValueError(f"FusedMLP: hidden {hidden} and intermediate {inter} must be multiples of 16")
        self.hidden, self.inter, self.eps = hidden, inter, eps
        self.block_n = _largest_pow2_divisor(inter, tiles[0])
        self.block_k = _largest_pow2_divisor(hidden, tiles[1])
        self.block_h = _largest_pow2_divisor(hidden, tiles[2])
        self.block_f = _largest_pow2_divisor(hidden, 1024)
        self.warps, self.stages = tiles[3], tiles[4]
        self.down_t, self.fence = down_t, fence
        self.acc = torch.zeros(BLOCK_T, hidden, dtype=torch.int64, device=device)
        self.cnt = torch.zeros(1, dtype=torch.int32, device=device)

    @staticmethod
    def fits(hidden: int, inter: int) -> bool:
        """Whether a model's sizes can run here: every tile is a power of two of at least 16."""
        return hidden % 16 == 0 and inter % 16 == 0

    def __call__(self, residual: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        """residual [T, H] (T <= BLOCK_T) += the folded MLP half, in place; gate_up [2 I, H] (the norm
        folded in), down [H, I] ([I, H] with down_t), all of one dtype, contiguous. -> residual."""
        t, h = residual.shape
        i = self.inter
        if h != self.hidden or gate_up.shape != (2 * i, h) or down.shape != ((i, h) if self.down_t else (h, i)):
            raise ValueError(f"FusedMLP: residual [T, {self.hidden}], gate_up [{2 * i}, {self.hidden}] and down "
                             f"[{self.hidden}, {i}] expected, got {tuple(residual.shape)}, {tuple(gate_up.shape)}, "
                             f"{tuple(down.shape)}")  # fmt: skip
        if not 1 <= t <= BLOCK_T:
            raise ValueError(f"FusedMLP: 1 to {BLOCK_T} rows, got {t}")
        if not (residual.dtype == gate_up.dtype == down.dtype):
            raise ValueError(f"FusedMLP: one dtype expected, got {residual.dtype}, {gate_up.dtype}, {down.dtype}")
        if not (residual.is_contiguous() and gate_up.is_contiguous() and down.is_contiguous()):
            raise ValueError("FusedMLP: residual, gate_up and down must be contiguous")
        precision = "ieee" if residual.dtype == torch.float32 else "tf32"  # tf32: unused by 16-bit dots
        _fused_mlp_launch[(i // self.block_n,)](
            residual, gate_up, down, self.acc, self.cnt, t, self.eps, H=h, INTER=i, BN=self.block_n,
            BK=self.block_k, BH=self.block_h, BT=BLOCK_T, FB=self.block_f, STAGES=self.stages, PRECISION=precision,
            SCALE=SCALE, DOWN_T=self.down_t, FENCE=self.fence, num_warps=self.warps,
        )  # fmt: skip
        return residual


def parse_config(text: str, device: torch.device) -> FusedMLP:
    """BLOCK_N x BLOCK_K x BLOCK_H x warps x stages [x t] [x nofence] -> the kernel at the 8B shape."""
    parts = text.split("x")
    tiles = tuple(int(v) for v in parts[:5])
    return FusedMLP(H, INTER, EPS, device, tiles, down_t="t" in parts[5:], fence="nofence" not in parts[5:])


def reference(res: torch.Tensor, gu: torch.Tensor, down: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The folded MLP half in float64: res + down(silu(gate * r) * (up * r))."""
    x = res.double()
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    y = x @ gu.double().t() * r
    return x + (torch.nn.functional.silu(y[:, :INTER]) * y[:, INTER:]) @ down.double().t()


def main() -> None:
    from services.worker.blas_choice import graph_ms, matmul
    from services.worker.kernels.silu_mul import silu_mul
    from services.worker.ops import RowNorm
    from tools.bench_blas import copy_gbps

    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--configs", default="128x64x128x8x4")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = [
        (torch.randn(2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02,
         torch.randn(H, INTER, device=dev, dtype=torch.bfloat16) * 0.02)
        for _ in range(LAYERS)
    ]  # fmt: skip
    floor_us = 3 * INTER * H * 2 / copy_gbps() / 1e3
    downs_t = [down.t().contiguous() for _, down in layers]
    forms = {"chain": None} | {c: parse_config(c, dev) for c in args.configs.split(",")}

    def run(form, res: torch.Tensor, count: int) -> None:
        for (gu, down), down_t in zip(layers[:count], downs_t[:count], strict=True):
            if form is None:
                matmul(silu_mul(matmul(res, gu), norm=RowNorm(res, EPS)), down, res, accumulate=True)
            else:
                form(res, gu, down_t if form.down_t else down)

    for batch in [int(b) for b in args.batches.split(",")]:
        res0 = torch.randn(batch, H, device=dev, dtype=torch.bfloat16)
        ref = reference(reference(res0, *layers[0]).to(torch.bfloat16), *layers[1])
        res = res0.clone()
        for rnd in range(args.rounds):
            for name, form in forms.items():
                try:
                    res.copy_(res0)
                    run(form, res, 2)
                    err = ((res.double() - ref).abs().max() / ref.abs().max()).item()
                    us = graph_ms(lambda form=form, res=res: run(form, res, LAYERS)) * 1e3 / LAYERS
                except Exception as e:  # a config that does not compile (shared memory) or launch
                    print(json.dumps({"batch": batch, "round": rnd, "what": name, "failed": str(e)[-500:]}))
                    continue
                print(json.dumps({"batch": batch, "round": rnd, "what": name, "us_layer": round(us, 2),
                                  "bytes_us": round(floor_us, 2), "err": err}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
