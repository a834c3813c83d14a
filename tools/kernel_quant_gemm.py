"""The weight GEMMs of a decode step, for tools/bench_kernels.py's quant_gemm part: each of
Llama-3-8B's projections (qkv, o, gate|up, down) at M = 1, 16, 64 and 256 rows, with its weight
in bf16 (PyTorch's matmul), FP8 (the Triton kernel, kernels/fp8_weight_matmul.py, and
torch._scaled_mm after the per-token quantization: the two fp8_product chooses between) and int4
(AWQ, group size 128: kernels/int4_matmul.py), each replayed from a CUDA graph as the decode
graphs run it, next to its floor: the bytes it must move (weight with its scales and zero points,
x, out) at the copy bandwidth measured in the same job. Per M, `layer` sums the four projections:
times 32 it is a decode step's projection time, the output layer aside.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tools.bench_kernels import Shapes, Timer

ROWS = (1, 16, 64, 256)


def projections(s: Shapes) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of one layer's projections at shape s."""
    qkv = (s.hq + 2 * s.hkv) * s.head_dim
    return {
        "qkv": (qkv, s.hidden),
        "o": (s.hidden, s.hq * s.head_dim),
        "gate_up": (2 * s.intermediate, s.hidden),
        "down": (s.hidden, s.intermediate),
    }


def _products(n: int, k: int, dtype: torch.dtype, dev: torch.device) -> dict[str, tuple[Callable, int]]:
    """variant -> (fn(x) -> x @ W.t(), the weight's bytes) for one random [N, K] weight."""
    from services.worker.kernels.fp8_weight_matmul import fp8_weight_matmul
    from services.worker.kernels.int4_matmul import int4_matmul
    from services.worker.models.fp8_weight import Fp8Weight
    from services.worker.models.int4_formats import from_awq, to_awq
    from services.worker.models.layers.fp8_product import fp8_scaled_mm, fp8_tensor_cores

    w = torch.randn(n, k, device=dev) * k**-0.5
    fp8 = Fp8Weight.quantize(w)
    awq = to_awq(w, 128)
    int4 = from_awq(awq["qweight"], awq["qzeros"], awq["scales"], 128).to(dev, dtype)
    bf16 = w.to(dtype)
    del w
    out = {
        "bf16": (lambda x: x @ bf16.t(), 2 * n * k),
        "fp8_triton": (lambda x: fp8_weight_matmul(x, fp8), n * k + 4 * n),
        "int4_awq": (lambda x: int4_matmul(x, int4), n * k // 2 + 3 * n * k // 128),
    }
    if fp8_tensor_cores(dev) and dtype == torch.bfloat16:
        out["fp8_scaled_mm"] = (lambda x: fp8_scaled_mm(x, fp8), n * k + 4 * n)
    return out


def quant_gemm(s: Shapes, dev: torch.device, timer: Timer, copy_gbs: float, rows: tuple[int, ...] = ROWS) -> dict:
    """{projection: {variant: {M: row}}, "layer": {variant: {M: ms}}}: each row the graph-replayed
    ms, GB/s moved and the floor's share of the time."""
    dtype = s.torch_dtype
    report: dict = {"copy_GBps": copy_gbs, "rows": list(rows)}
    layer: dict = {}
    for name, (n, k) in projections(s).items():
        report[name] = {"n": n, "k": k}
        for variant, (fn, weight_bytes) in _products(n, k, dtype, dev).items():
            cells = report[name].setdefault(variant, {})
            for m in rows:
                x = torch.randn(m, k, device=dev).to(dtype)
                moved = weight_bytes + 2 * m * (k + n)
                ms = timer.graphed(lambda fn=fn, x=x: fn(x))
                floor_ms = moved / (copy_gbs * 1e6)
                cells[str(m)] = {"ms": ms, "GB/s": moved / ms / 1e6, "floor_ms": floor_ms, "of_floor": floor_ms / ms}
                sums = layer.setdefault(variant, {})
                sums[str(m)] = sums.get(str(m), 0.0) + ms
            print(name, variant, {m: round(c["ms"] * 1e3, 1) for m, c in cells.items()}, "us", flush=True)
    report["layer"] = layer
    return report
