"""Microbenchmarks of the worker's Triton kernels next to the same GPU's ceilings.

    python tools/bench_kernels.py --out FILE.json [--sweep] [--sweep-seq 4096]
    python tools/bench_kernels.py --parts ceilings,quant_gemm --out FILE.json   # the weight GEMMs only
    python tools/bench_kernels.py --cpu-smoke --out FILE.json   # tiny shapes, Triton interpreter

Ceilings: device-to-device copy bandwidth (read + write bytes) and a bf16 8192^3 matmul.
Kernels at Llama-3-8B shapes (Hq 32, Hkv 8, D 128, hidden 4096, intermediate 14336, bf16):
decode attention (batch 64, context 1024 and 2048, KV slots scattered and contiguous; timed per
launch and replayed from a CUDA graph, as the engine runs it) as
GB/s of K/V + q + out and as % of the copy bandwidth; causal extend attention (4096 and 8192
tokens, no prefix and a 2048-token prefix) as TFLOP/s, causal FLOPs 4*S^2*D*Hq/2 plus
4*S*P*D*Hq for a prefix, next to torch SDPA's flash backend; the elementwise kernels at 8192
tokens as GB/s. Times are triton.testing.do_bench medians. --sweep also times launch
configurations of both attention kernels (each checked against the default config's output)
and prints the best. quant_gemm (not a default part; tools/kernel_quant_gemm.py) times each
projection's GEMM with bf16, FP8 and int4 weights at M = 1 to 256 against its bytes-moved floor.
--cpu-smoke runs everything once at tiny shapes under the interpreter,
to check the script itself without a GPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch


@dataclass(frozen=True)
class Shapes:
    hq: int = 32
    hkv: int = 8
    head_dim: int = 128
    hidden: int = 4096
    intermediate: int = 14336
    tokens: int = 8192  # elementwise kernels
    decode_batch: int = 64
    decode_contexts: tuple[int, ...] = (1024, 2048)
    extend_seqs: tuple[int, ...] = (4096, 8192)
    extend_prefix: int = 2048
    copy_bytes: int = 4 << 30
    matmul_n: int = 8192
    dtype: str = "bfloat16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# the interpreter's tl.dot mishandles bfloat16: the smoke run uses float16
SMOKE = Shapes(4, 2, 32, 256, 512, 64, 3, (48,), (40,), 24, 1 << 20, 64, "float16")


PARTS = ("ceilings", "elementwise", "decode", "extend", "quant_gemm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON file for the results")
    p.add_argument("--sweep", action="store_true", help="also sweep launch configs of the attention kernels")
    p.add_argument("--sweep-seq", type=int, default=4096, help="extend length of the sweep")
    p.add_argument(
        "--split-sweep",
        action="store_true",
        help="decode attention over batch x context x (grid splits, split_tokens): data for the split rule",
    )
    p.add_argument("--parts", default=",".join(PARTS[:-1]), help=f"from {','.join(PARTS)} (ceilings always run)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes under the Triton interpreter, on the CPU")
    args = p.parse_args(argv)
    args.part_list = args.parts.split(",")
    if unknown := set(args.part_list) - set(PARTS):
        p.error(f"unknown parts {sorted(unknown)}: choose from {','.join(PARTS)}")
    return args


class Timer:
    """Median milliseconds of fn(): do_bench on CUDA, one plain call under the interpreter."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    def graphed(self, fn: Callable[[], object]) -> float:
        """Median milliseconds of fn() replayed from a CUDA graph, as the engine's decode steps
        run: the host's launch time is out of it (do_bench times each launch, which for a kernel
        of under 100 µs is a real part of what it measures). The plain call off CUDA."""
        if self.cuda:
            import triton.testing

            return float(triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median"))
        return self(fn)


def bench_ceilings(s: Shapes, dev, timer: Timer) -> dict:
    src = torch.empty(s.copy_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    a = torch.randn(s.matmul_n, s.matmul_n, dtype=s.torch_dtype, device=dev)
    b = torch.randn_like(a)
    mm_ms = timer(lambda: a @ b)
    return {
        "copy": {"bytes": 2 * s.copy_bytes, "ms": ms, "GB/s": 2 * s.copy_bytes / ms / 1e6},
        "matmul_bf16": {"n": s.matmul_n, "ms": mm_ms, "TFLOP/s": 2 * s.matmul_n**3 / mm_ms / 1e9},
    }


def bench_elementwise(s: Shapes, dev, timer: Timer) -> dict:
    from services.worker.kernels.add_rmsnorm import add_rmsnorm_
    from services.worker.kernels.kv_store import store_kv
    from services.worker.kernels.rmsnorm import rmsnorm
    from services.worker.kernels.rotary import rotary_
    from services.worker.kernels.silu_mul import silu_mul
    from services.worker.models.layers.rope import cos_sin_table

    t, h, dt, e = s.tokens, s.hidden, s.torch_dtype, 2  # e: bytes per element
    x = torch.randn(t, h, dtype=dt, device=dev)
    res = torch.randn_like(x)
    w = torch.ones(h, dtype=dt, device=dev)
    qkv = torch.randn(t, (s.hq + 2 * s.hkv) * s.head_dim, dtype=dt, device=dev)
    q = qkv[:, : s.hq * s.head_dim].view(t, s.hq, s.head_dim)
    k = qkv[:, s.hq * s.head_dim : (s.hq + s.hkv) * s.head_dim].view(t, s.hkv, s.head_dim)
    v = qkv[:, (s.hq + s.hkv) * s.head_dim :].view(t, s.hkv, s.head_dim)
    cos_sin = cos_sin_table(s.head_dim, 500000.0, {}, t, dev)
    positions = torch.arange(t, device=dev)
    gate_up = torch.randn(t, 2 * s.intermediate, dtype=dt, device=dev)
    pool = torch.empty(t + 1, s.hkv, s.head_dim, dtype=dt, device=dev)
    v_pool = torch.empty_like(pool)
    slots = torch.randperm(t, device=dev).to(torch.int32)
    cases: dict[str, tuple[Callable[[], object], int]] = {
        "rmsnorm": (lambda: rmsnorm(x, w, 1e-5), 2 * t * h * e),
        "add_rmsnorm": (lambda: add_rmsnorm_(x, res, w, 1e-5), 4 * t * h * e),
        "rotary": (lambda: rotary_(q, k, positions, cos_sin), 2 * t * (s.hq + s.hkv) * s.head_dim * e),
        "silu_mul": (lambda: silu_mul(gate_up), 3 * t * s.intermediate * e),
        "kv_store": (lambda: store_kv(k, v, pool, v_pool, slots), 4 * t * s.hkv * s.head_dim * e),
    }
    out = {}
    for name, (fn, nbytes) in cases.items():
        ms = timer(fn)
        out[name] = {"tokens": t, "bytes": nbytes, "ms": ms, "GB/s": nbytes / ms / 1e6}
    return out


def _decode_setup(s: Shapes, ctx: int, scattered: bool, int8: bool, dev) -> dict:
    b = s.decode_batch
    capacity = b * ctx + 1
    dtype = torch.int8 if int8 else s.torch_dtype
    shape = (capacity, s.hkv, s.head_dim)
    if int8:
        k_pool = torch.randint(-127, 128, shape, dtype=dtype, device=dev)
        v_pool = torch.randint(-127, 128, shape, dtype=dtype, device=dev)
    else:
        k_pool = torch.randn(shape, dtype=dtype, device=dev)
        v_pool = torch.randn(shape, dtype=dtype, device=dev)
    order = torch.randperm(b * ctx, device=dev) if scattered else torch.arange(b * ctx, device=dev)
    scales = {}
    if int8:
        scales = {
            "k_scale": torch.rand(capacity, s.hkv, device=dev) / 64,
            "v_scale": torch.rand(capacity, s.hkv, device=dev) / 64,
        }
    return {
        "q": torch.randn(b, s.hq, s.head_dim, dtype=s.torch_dtype, device=dev),
        "k_pool": k_pool,
        "v_pool": v_pool,
        "req_table": order.view(b, ctx).to(torch.int32),
        "rows": torch.arange(b, dtype=torch.int32, device=dev),
        "seq_lens": torch.full((b,), ctx, dtype=torch.int32, device=dev),
        "scale": s.head_dim**-0.5,
        **scales,
    }


def decode_bytes(s: Shapes, ctx: int, int8: bool) -> int:
    tokens = s.decode_batch * ctx
    kv = 2 * tokens * s.hkv * (s.head_dim * (1 if int8 else 2) + (4 if int8 else 0))
    return kv + tokens * 4 + 2 * s.decode_batch * s.hq * s.head_dim * 2  # + slots, q and out


def bench_decode(s: Shapes, dev, timer: Timer, num_sms: int, copy_gbs: float) -> dict:
    from services.worker.kernels.decode_attention import (
        SPLIT_TOKENS,
        choose_num_splits,
        decode_attention,
        decode_scratch,
    )

    out = {}
    for ctx, scattered, int8 in [(c, sc, False) for c in s.decode_contexts for sc in (True, False)] + [
        (s.decode_contexts[-1], True, True)
    ]:
        args = _decode_setup(s, ctx, scattered, int8, dev)
        splits = choose_num_splits(s.decode_batch, s.hkv, ctx, num_sms)
        # preallocated scratch and output, as the attention backend runs it
        args["mid_o"], args["mid_lse"] = decode_scratch(s.decode_batch, s.hq, s.head_dim, splits, dev)
        args["out"] = torch.empty_like(args["q"])

        def run(args: dict = args, splits: int = splits) -> torch.Tensor:
            return decode_attention(num_splits=splits, split_tokens=SPLIT_TOKENS, **args)

        ms, graph_ms = timer(run), timer.graphed(run)
        nbytes = decode_bytes(s, ctx, int8)
        name = f"ctx{ctx}_{'scattered' if scattered else 'contiguous'}{'_int8' if int8 else ''}"
        gbs, graph_gbs = nbytes / ms / 1e6, nbytes / graph_ms / 1e6
        out[name] = {
            "batch": s.decode_batch,
            "context": ctx,
            "num_splits": splits,
            "bytes": nbytes,
            "ms": ms,
            "GB/s": gbs,
            "pct_of_copy": 100 * gbs / copy_gbs,
            "graph_ms": graph_ms,
            "graph_pct_of_copy": 100 * graph_gbs / copy_gbs,
        }
    return out


def _extend_setup(s: Shapes, seq: int, prefix: int, dev) -> dict:
    hq, hkv, d = s.hq, s.hkv, s.head_dim
    qkv = torch.randn(seq, hq + 2 * hkv, d, dtype=s.torch_dtype, device=dev)
    capacity = max(prefix, 1) + 1
    table = torch.zeros(1, max(prefix, 1), dtype=torch.int32, device=dev)
    table[0, :prefix] = torch.randperm(prefix, device=dev).to(torch.int32)
    i32 = lambda x: torch.tensor([x], dtype=torch.int32, device=dev)
    return {
        "q": qkv[:, :hq],
        "k_new": qkv[:, hq : hq + hkv],
        "v_new": qkv[:, hq + hkv :],
        "k_pool": torch.randn(capacity, hkv, d, dtype=s.torch_dtype, device=dev),
        "v_pool": torch.randn(capacity, hkv, d, dtype=s.torch_dtype, device=dev),
        "req_table": table,
        "rows": i32(0),
        "starts": i32(0),
        "extend_lens": i32(seq),
        "prefix_lens": i32(prefix),
        "max_extend_len": seq,
        "scale": d**-0.5,
        "out": torch.empty(seq, hq, d, dtype=s.torch_dtype, device=dev),
    }


def _extend_flops(s: Shapes, seq: int, prefix: int) -> float:
    return 4 * seq * seq * s.head_dim * s.hq / 2 + 4 * seq * prefix * s.head_dim * s.hq


def bench_extend(s: Shapes, dev, timer: Timer) -> dict:
    from services.worker.kernels.extend_attention import extend_attention

    out = {}
    for seq in s.extend_seqs:
        for prefix in (0, s.extend_prefix):
            args = _extend_setup(s, seq, prefix, dev)
            ms = timer(lambda args=args: extend_attention(**args))
            flops = _extend_flops(s, seq, prefix)
            out[f"seq{seq}_prefix{prefix}"] = {"ms": ms, "TFLOP/s": flops / ms / 1e9}
        out[f"seq{seq}_prefix0"]["sdpa_flash"] = _bench_sdpa(s, seq, dev, timer)
    return out


def _bench_sdpa(s: Shapes, seq: int, dev, timer: Timer) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(1, s.hq, seq, s.head_dim, dtype=s.torch_dtype, device=dev) for _ in range(3))
    backend = SDPBackend.FLASH_ATTENTION if dev.type == "cuda" else SDPBackend.MATH
    try:
        with sdpa_kernel(backend):
            ms = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    except RuntimeError as err:  # no flash kernel for this GPU or build
        return {"error": str(err).splitlines()[0]}
    return {"backend": backend.name, "ms": ms, "TFLOP/s": _extend_flops(s, seq, 0) / ms / 1e9}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import triton

    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit("bench_kernels: no CUDA device (use --cpu-smoke to check the script on the CPU)")
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    s = SMOKE if args.cpu_smoke else Shapes()
    timer = Timer(dev.type == "cuda")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    torch.manual_seed(0)
    started = time.time()
    report: dict = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (interpreter smoke run)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shapes": asdict(s),
    }
    report["ceilings"] = bench_ceilings(s, dev, timer)
    copy_gbs = report["ceilings"]["copy"]["GB/s"]
    parts = set(args.part_list)
    if "elementwise" in parts:
        report["elementwise"] = bench_elementwise(s, dev, timer)
    if "decode" in parts:
        report["decode"] = bench_decode(s, dev, timer, num_sms, copy_gbs)
    if "extend" in parts:
        report["extend"] = bench_extend(s, dev, timer)
    # these import this module: not at its top
    from tools.kernel_quant_gemm import quant_gemm
    from tools.kernel_sweeps import split_sweep, sweep

    if "quant_gemm" in parts:
        report["quant_gemm"] = quant_gemm(s, dev, timer, copy_gbs)

    if args.sweep:
        report["sweep"] = sweep(s, dev, timer, min(args.sweep_seq, max(s.extend_seqs)), num_sms)
    if args.split_sweep:
        report["split_sweep"] = split_sweep(s, dev, timer, copy_gbs, args.cpu_smoke)
    report["seconds"] = time.time() - started
    print(json.dumps({k: v for k, v in report.items() if "sweep" not in k}, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
