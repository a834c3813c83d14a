"""The routed experts' kernels (kernels/fused_moe.py) against the GPU's copy bandwidth, at real
mixture-of-experts shapes, and next to PyTorch's loop over the experts (layers/moe.py).

    python tools/bench_moe.py --out FILE.json [--shape mixtral-8x7b|qwen3-30b-a3b] [--sweep] [--fp8]
    python tools/bench_moe.py --cpu-smoke --out FILE.json   # tiny shapes, Triton interpreter

For each token count T, one layer's experts (bf16, routing drawn uniformly at random), timed
replayed from a CUDA graph as the engine runs them: milliseconds (and moe_align's alone), the
bytes of the experts' weights the step reads (the distinct experts hit) as GB/s and as % of the
copy bandwidth, and TFLOP/s (2 * T * k * 3 * H * I). --sweep times every launch configuration
of SWEEP (of SWEEP_DECODE at decode sizes) at each T (each checked against the default's output)
and prints the fastest, the data behind pick_tiles.
--fp8 also times the same experts in FP8 (Fp8ExpertWeight, quantized from the bf16 draws) at the
same T and routing: its milliseconds, its bytes (e4m3 weights plus float32 scales of the experts
hit) as GB/s and % of copy, and its speed-up over bf16 (row "fp8"); with --sweep, the FP8
kernel's configurations are swept too.
--cpu-smoke runs once at tiny shapes under the interpreter to check the script; its numbers mean
nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

# hidden, each expert's width, experts, experts per token
SHAPES = {"mixtral-8x7b": (4096, 14336, 8, 2), "qwen3-30b-a3b": (2048, 768, 128, 8)}
TOKENS = (1, 4, 16, 64, 256, 1024, 2048, 4096)
SMOKE_SHAPE, SMOKE_TOKENS = (64, 48, 4, 2), (1, 9)
# (block_m, block_n, block_k, group_m, num_warps, num_stages); a configuration whose tiles do not
# fit the GPU's shared memory is skipped
SWEEP = list(itertools.product((16, 32, 64), (64, 128), (64, 128), (8,), (4, 8), (3,)))
# where each expert gets at most 16 entries (decode sizes: pick_tiles' first case) a step reads the
# experts' weights and the row block is padding, so the sweep there varies what moves the weights
SWEEP_DECODE = list(itertools.product((16,), (32, 64, 128), (64, 128, 256), (1,), (2, 4), (3, 4, 5)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--shape", choices=sorted(SHAPES), default="mixtral-8x7b")
    p.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    p.add_argument("--sweep", action="store_true", help="also time every launch configuration of SWEEP")
    p.add_argument("--fp8", action="store_true", help="also time the FP8 experts at the same shapes")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes under the Triton interpreter, on the CPU")
    return p.parse_args(argv)


def timed(fn, cuda: bool) -> float:
    """Median ms of fn() replayed from a CUDA graph; one plain call under the interpreter."""
    if not cuda:
        import time

        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))


def copy_gbps(dev: torch.device, cuda: bool) -> float:
    """Device-to-device copy, bytes read and written (as tools/bench_kernels.py measures it)."""
    src = torch.empty(4 << 30 if cuda else 1 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    if not cuda:
        return 2 * src.numel() / timed(lambda: dst.copy_(src), cuda) / 1e6
    import triton.testing

    return 2 * src.numel() / triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e6


def bench(t: int, shape: tuple[int, int, int, int], dtype: torch.dtype, dev, cuda: bool, args) -> dict:
    from services.worker.kernels.fused_moe import fused_experts, pick_tiles  # after TRITON_INTERPRET
    from services.worker.kernels.moe_align import moe_align
    from services.worker.models.fp8_weight import Fp8ExpertWeight
    from services.worker.models.layers.moe import experts_reference, route

    h, inter, experts, k = shape
    g = torch.Generator(device=dev).manual_seed(t)
    x = torch.randn(t, h, device=dev, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, h, device=dev, generator=g) * h**-0.5).to(dtype)
    w2 = (torch.randn(experts, h, inter, device=dev, generator=g) * inter**-0.5).to(dtype)
    weights, ids = route(torch.randn(t, experts, device=dev, generator=g), k, True, torch.float32)
    hit = ids.unique().numel()
    weight_bytes = hit * 3 * h * inter * w13.element_size()
    ms = timed(lambda: fused_experts(x, w13, w2, weights, ids), cuda)
    tiles = pick_tiles(t * k, experts, dtype)
    row = {
        "tiles": tiles._asdict(),
        "align_ms": timed(lambda: moe_align(ids, experts, tiles.block_m), cuda),
        "experts_hit": hit,
        "ms": ms,
        "weights GB/s": weight_bytes / ms / 1e6,
        "TFLOP/s": 2 * t * k * 3 * h * inter / ms / 1e9,
        "torch_loop_ms": timed(lambda: experts_reference(x, w13, w2, weights, ids), False),
    }
    if args.sweep:
        row["sweep_best"] = sweep(x, w13, w2, weights, ids, cuda)
    if args.fp8:
        f13, f2 = Fp8ExpertWeight.quantize(w13), Fp8ExpertWeight.quantize(w2)
        fp8_ms = timed(lambda: fused_experts(x, f13, f2, weights, ids), cuda)
        fp8_bytes = hit * (3 * h * inter + 4 * (2 * inter + h))  # e4m3 weights, float32 scales
        row["fp8"] = {
            "ms": fp8_ms,
            "weight_bytes": fp8_bytes,
            "bf16_weight_bytes": weight_bytes,
            "weights GB/s": fp8_bytes / fp8_ms / 1e6,
            "speedup_over_bf16": ms / fp8_ms,
        }
        if args.sweep:
            row["fp8"]["sweep_best"] = sweep(x, f13, f2, weights, ids, cuda)
    return row


def sweep(x, w13, w2, weights, ids, cuda: bool) -> list[dict]:
    """The three fastest configurations of SWEEP (SWEEP_DECODE where each expert gets at most 16
    entries), each checked against the default's output."""
    from services.worker.kernels.fused_moe import MoeTiles, fused_experts

    want = fused_experts(x, w13, w2, weights, ids)
    best = []
    decode = ids.numel() <= 16 * w13.shape[0]
    for c in SWEEP_DECODE if decode else SWEEP:
        tiles = MoeTiles(*c)
        try:
            got = fused_experts(x, w13, w2, weights, ids, tiles)
        except Exception as e:  # Triton's OutOfResources: tiles too large for shared memory
            print(f"  {tiles}: skipped ({type(e).__name__})")
            continue
        if not torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2):
            raise AssertionError(f"{tiles} disagrees with the default configuration")
        best.append((timed(lambda tiles=tiles: fused_experts(x, w13, w2, weights, ids, tiles), cuda), c))
    best.sort()
    return [{"ms": m, "tiles": MoeTiles(*c)._asdict()} for m, c in best[:3]]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cuda = not args.cpu_smoke
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    dev = torch.device("cuda" if cuda else "cpu")
    shape, tokens = (SHAPES[args.shape], args.tokens) if cuda else (SMOKE_SHAPE, SMOKE_TOKENS)
    dtype = torch.bfloat16 if cuda else torch.float16  # the interpreter's tl.dot mishandles bfloat16
    gbps = copy_gbps(dev, cuda)
    report = {"shape": dict(zip(("hidden", "inter", "experts", "top_k"), shape, strict=True)), "copy GB/s": gbps}
    for t in tokens:
        row = bench(t, shape, dtype, dev, cuda, args)
        row["% of copy"] = 100 * row["weights GB/s"] / gbps
        report[f"T={t}"] = row
        best = f", best swept {row['sweep_best'][0]['ms']:.3f} ms" if args.sweep else ""
        print(
            f"T={t:5d}: {row['ms']:.3f} ms (align {row['align_ms']:.3f}), {row['experts_hit']} experts, "
            f"weights {row['weights GB/s']:.0f} GB/s "
            f"({row['% of copy']:.0f} % of copy), {row['TFLOP/s']:.1f} TFLOP/s; PyTorch loop "
            f"{row['torch_loop_ms']:.3f} ms{best}",
            flush=True,
        )
        if args.fp8:
            fp8 = row["fp8"]
            fp8["% of copy"] = 100 * fp8["weights GB/s"] / gbps
            print(
                f"         FP8: {fp8['ms']:.3f} ms, {fp8['weight_bytes'] / 1e6:.1f} MB "
                f"(bf16 {fp8['bf16_weight_bytes'] / 1e6:.1f}), {fp8['weights GB/s']:.0f} GB/s "
                f"({fp8['% of copy']:.0f} % of copy), {fp8['speedup_over_bf16']:.2f}x bf16",
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
