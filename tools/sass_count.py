"""Compile a Triton kernel for an H100/H200 (sm_90) on a machine without a GPU, with the ptxas
and cuobjdump that ship with Triton, and count the instructions of its SASS: the whole kernel by
opcode, and its main loop (the longest backward branch). A kernel's cost in issue slots, read
before any GPU time is spent (run without TRITON_INTERPRET, which swaps kernels for the
interpreter's).

    python tools/sass_count.py int4-one-row [--pairs 0|1] [--dtype bf16|fp16] [--block-n 64] [--block-k 128] [--warps 1]
    python tools/sass_count.py decode-e4m3 [--scales i8|fp32]
    python tools/sass_count.py moe-int4 [--gemm gate_up|down] [--tiles small|large]

prints a JSON line: the loop's instructions (int4: a weight a thread too) and the opcodes' counts.
decode-e4m3: decode attention's stage 1 over an e4m3 pool at Llama-3-8B's heads, as
decode_config launches it (LDGSTS counts its asynchronous copies)."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton
from triton.backends.compiler import GPUTarget

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_OP = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)(?:\s+0x([0-9a-f]+))?")


def compile_sm90(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    warps: int,
    stages: int,
    divisible: frozenset[str] = frozenset(),
) -> bytes:
    """fn (a @triton.jit kernel) compiled for sm_90 -> its cubin. signature: each runtime
    argument's Triton type ("*bf16", "i32"); constexprs: the compile-time ones' values; divisible:
    the integers a real launch passes as multiples of 16. Triton's launcher specializes those, and
    every pointer to a tensor's start (16-byte aligned), as divisible by 16, but not the kernel's
    do_not_specialize arguments; its loads vectorize only where it can prove that: without the
    same marks the SASS is another kernel's."""
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default and p.name not in constexprs}
    constexprs = constexprs | defaults
    sig = dict(signature) | {name: "constexpr" for name in constexprs}
    names = fn.arg_names
    kept = {p.name for p in fn.params if p.do_not_specialize}
    marked = [n for n, t in signature.items() if t[0] == "*" or (n in divisible and n not in kept)]
    marks = {(names.index(n),): [["tt.divisibility", 16]] for n in marked}
    src = triton.compiler.ASTSource(
        fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=marks
    )
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    return kernel.asm["cubin"]


def sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"cuobjdump: {done.stderr.strip()}")
    return done.stdout


def count(text: str) -> tuple[collections.Counter, int]:
    """(instructions by opcode, without modifiers; the main loop's length in instructions)."""
    ops: collections.Counter = collections.Counter()
    loop = 0
    for line in text.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        at, op, target = int(m.group(1), 16), m.group(2), m.group(3)
        ops[op.split(".")[0]] += 1
        if op == "BRA" and target is not None and int(target, 16) < at:
            loop = max(loop, (at - int(target, 16)) // 16 + 1)
    return ops, loop


INT4_SIGNATURE = {
    "x_ptr": "*bf16",
    "qw_ptr": "*i32",
    "z_ptr": "*u8",
    "s_ptr": "*bf16",
    "out_ptr": "*fp32",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "x_row_stride": "i32",
    "out_row_stride": "i32",
    "share_stride": "i32",
    "k_per_share": "i32",
}


def int4_one_row(pairs: int, dtype: str, block_n: int, block_k: int, warps: int, stages: int = 3) -> dict:
    """int4_matmul's kernel at one row (an FMA tile, split partials), float32 path (pairs 0) or
    packed pairs in PTX (pairs 1)."""
    from services.worker.kernels.int4_matmul import _int4_matmul_kernel

    constexprs = dict(
        GROUP=128,
        BLOCK_M=1,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PARTIAL=True,
        ACCUMULATE=False,
        IEEE=False,
        DOT=False,
        PAIRS=pairs,
    )
    sig = INT4_SIGNATURE | {"x_ptr": f"*{dtype}", "s_ptr": f"*{dtype}"}
    # Llama-3-8B's shapes at one row: every integer but M a multiple of 16
    divisible = frozenset(n for n in INT4_SIGNATURE if n in ("N", "K") or n.endswith(("stride", "share")))
    ops, loop = count(sass(compile_sm90(_int4_matmul_kernel, sig, constexprs, warps, stages, divisible)))
    weights = block_n * block_k / (32 * warps)  # a step's weights a thread
    return {"loop": loop, "per_weight": round(loop / weights, 3), "ops": dict(ops.most_common())}


def decode_e4m3(scales: str) -> dict:
    """Decode attention's stage 1 over an e4m3 pool (one split, float16 dots, GQA 4, head dim 128)
    with int8 exponent or float32 scales."""
    import torch

    from services.worker.kernels.decode_attention import decode_config
    from services.worker.kernels.decode_split import _decode_split_kernel

    cfg = decode_config(128, torch.bfloat16, True, quantized=True)
    constexprs = dict(GROUP=4, HEAD_DIM=128, BLOCK_G=16, BLOCK_D=128, BLOCK_N=cfg["BLOCK_N"], BLOCK_S=8)
    constexprs |= dict(
        NORM_BLOCK=4096, QUANT=True, IEEE=False, DIRECT=True, FUSED=False, WINDOW=0, SOFTCAP=0.0, F16=True
    )
    pointers = dict(k_ptr="*fp8e4nv", v_ptr="*fp8e4nv", ks_ptr=f"*{scales}", vs_ptr=f"*{scales}", mid_lse_ptr="*fp32")
    pointers |= dict(
        cs_ptr="*fp32", table_ptr="*i32", rows_ptr="*i32", lens_ptr="*i32", cnt_ptr="*i32", slot_ptr="*i32"
    )
    sig = {}
    for name in _decode_split_kernel.arg_names:
        if name in constexprs:
            continue
        if name.endswith("_ptr"):
            sig[name] = pointers.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in ("nrm_eps", "qk_scale") else "i32"
    # the strides of q, the pools and the tables are multiples of 16 at these heads (the kernel
    # leaves the scales' and the scratch's unspecialized)
    divisible = frozenset(n for n in sig if n.endswith("stride"))
    cubin = compile_sm90(_decode_split_kernel, sig, constexprs, cfg["num_warps"], cfg["num_stages"], divisible)
    ops, loop = count(sass(cubin))
    return {"loop": loop, "ops": dict(ops.most_common())}


def moe_int4(gate_up: bool, tiles: str) -> dict:
    """The grouped GEMM of a mixture of experts (fused_moe.py) on AWQ/GPTQ int4 experts (groups of
    128) with bf16 x, gate|up or down, at pick_tiles' decode ("small": 16 rows) or prefill
    ("large": 64) tiles."""
    from services.worker.kernels.fused_moe import MoeTiles, _fused_moe_kernel

    t = MoeTiles(16, 64, 128, 1, 4, 4) if tiles == "small" else MoeTiles(64, 128, 64, 8, 8, 3)
    constexprs = dict(TOP_K=2 if gate_up else 1, GATE_UP=gate_up, WEIGHTED=not gate_up, HAS_SCALE=False, INT4=True)
    constexprs |= dict(GROUP=128, EVEN_K=True, IEEE=False, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k)
    pointers = dict(b_ptr="*i32", zeros_ptr="*u8", weights_ptr="*fp32", sorted_ptr="*i32", block_expert_ptr="*i32")
    sig = {n: pointers.get(n, "*bf16") if n.endswith("_ptr") else "i32" for n in _fused_moe_kernel.arg_names}
    sig = {n: v for n, v in sig.items() if n not in constexprs and n != "GROUP_M"}
    divisible = frozenset(n for n in sig if n in ("N", "K") or n.startswith("stride"))
    cubin = compile_sm90(
        _fused_moe_kernel, sig, constexprs | {"GROUP_M": t.group_m}, t.num_warps, t.num_stages, divisible
    )
    ops, loop = count(sass(cubin))
    return {"loop": loop, "ops": dict(ops.most_common())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel", choices=("int4-one-row", "decode-e4m3", "moe-int4"))
    ap.add_argument("--gemm", default="gate_up", choices=("gate_up", "down"), help="moe-int4: which product")
    ap.add_argument("--tiles", default="small", choices=("small", "large"), help="moe-int4: decode or prefill tiles")
    ap.add_argument("--scales", default="i8", choices=("i8", "fp32"), help="decode-e4m3: the pool's scales")
    ap.add_argument("--pairs", type=int, default=1, choices=(0, 1))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="x's; pairs in PTX: bf16 only")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--block-k", type=int, default=128)
    ap.add_argument("--warps", type=int, default=1)
    args = ap.parse_args(argv)
    if args.kernel == "decode-e4m3":
        print(json.dumps(decode_e4m3(args.scales)), flush=True)
    elif args.kernel == "moe-int4":
        print(json.dumps(moe_int4(args.gemm == "gate_up", args.tiles)), flush=True)
    else:
        print(json.dumps(int4_one_row(args.pairs, args.dtype, args.block_n, args.block_k, args.warps)), flush=True)


if __name__ == "__main__":
    main()
