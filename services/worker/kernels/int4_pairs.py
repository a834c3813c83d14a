"""int4 weights against one row of bfloat16 x in packed pairs (int4_matmul's one-row path):
two weights an instruction where the float32 path takes one.

A word of qweight holds the nibbles of input rows 8i + j at bits 4j. Shifted right by 4p and
masked with 0x000F000F, it holds nibbles p and p + 4, one in each 16-bit half; OR-ed with 0x4300
(bfloat16 128, whose last mantissa bit is worth 1) each half reads 128 + q exactly, and less
128 + zero (one packed FMA) it is q - zero. x's words (x[8i], x[8i + 1]) ... are permuted into
the matching pairs (x[8i + p], x[8i + p + 4]) once a step, for every column of the tile. A
word's eight products are summed in bfloat16, four packed FMAs deep, then its two halves in
float32: a product rounded to bfloat16 as the reference rounds a dequantized weight, so the error
is of the same size. On an H100 (sm_90) the loop is about 3.1 instructions a weight against the
float32 path's 5.9 (tools/sass_count.py).

ASM runs the pairs in PTX (fma.rn.bf16x2: sm_80 and newer). Without it the same arithmetic runs
in Triton, each packed FMA rounded to the pair's format, for the interpreter, which runs no
inline PTX and has no bfloat16: there the pairs are float16 (MAGIC 1024), which tests the
indexing and sums on the CPU. float16 is not run in PTX: its products of q - zero (up to 15)
with x would overflow where |x| passes about a thousand."""

from __future__ import annotations

import triton
import triton.language as tl

# one word's eight products: $1 the word, $2..$5 x's pairs for nibbles (0, 4) .. (3, 7), $6 the
# pair 128 + zero; $0 the float32 bits of their sum. 0x3F80 and 0x8000 are bfloat16's 1.0 and
# -0.0; a bfloat16 is the top half of its float32.
WORD_DOT = tl.constexpr("""{
.reg .b32 t0, t1, t2, t3, w4, w8, w12, nm, acc, lo, hi, one, nz;
.reg .f32 flo, fhi, fs;
lop3.b32 t0, $1, 0x000F000F, 0x43004300, 0xEA;
shr.u32 w4, $1, 4;
lop3.b32 t1, w4, 0x000F000F, 0x43004300, 0xEA;
shr.u32 w8, $1, 8;
lop3.b32 t2, w8, 0x000F000F, 0x43004300, 0xEA;
shr.u32 w12, $1, 12;
lop3.b32 t3, w12, 0x000F000F, 0x43004300, 0xEA;
xor.b32 nm, $6, 0x80008000;
mov.b32 one, 0x3F803F80;
mov.b32 nz, 0x80008000;
fma.rn.bf16x2 t0, t0, one, nm;
fma.rn.bf16x2 t1, t1, one, nm;
fma.rn.bf16x2 t2, t2, one, nm;
fma.rn.bf16x2 t3, t3, one, nm;
fma.rn.bf16x2 acc, t0, $2, nz;
fma.rn.bf16x2 acc, t1, $3, acc;
fma.rn.bf16x2 acc, t2, $4, acc;
fma.rn.bf16x2 acc, t3, $5, acc;
shl.b32 lo, acc, 16;
and.b32 hi, acc, 0xFFFF0000;
mov.b32 flo, lo;
mov.b32 fhi, hi;
add.f32 fs, flo, fhi;
mov.b32 $0, fs;
}""")
MAGIC_BF16 = tl.constexpr(0x4300)


@triton.jit
def _half(bits, BF16: tl.constexpr):
    """The 16-bit float in the low half of int32 bits, as float32."""
    if BF16:
        return (bits << 16).to(tl.float32, bitcast=True)
    return (bits & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _round(v, BF16: tl.constexpr):
    """float32 v rounded to the pair's format (to nearest, ties to even), as float32."""
    if BF16:
        b = v.to(tl.int32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
        return b.to(tl.float32, bitcast=True)
    return v.to(tl.float16).to(tl.float32)


@triton.jit
def _lane_dot(w, p0, p1, p2, p3, zf, SHIFT: tl.constexpr, BF16: tl.constexpr):
    """One half's four products, summed as the packed FMAs sum them: nibbles SHIFT / 4 + (0..3)."""
    acc = _round((((w >> SHIFT) & 0xF).to(tl.float32) - zf) * _half(p0 >> SHIFT, BF16), BF16)
    acc = _round((((w >> (SHIFT + 4)) & 0xF).to(tl.float32) - zf) * _half(p1 >> SHIFT, BF16) + acc, BF16)
    acc = _round((((w >> (SHIFT + 8)) & 0xF).to(tl.float32) - zf) * _half(p2 >> SHIFT, BF16) + acc, BF16)
    return _round((((w >> (SHIFT + 12)) & 0xF).to(tl.float32) - zf) * _half(p3 >> SHIFT, BF16) + acc, BF16)


@triton.jit
def word_dots(w, p0, p1, p2, p3, z, BF16: tl.constexpr, ASM: tl.constexpr):
    """Each word's eight products with x's pairs, summed, float32: w [R, N] int32 words, p0..p3
    [R, 1] pairs, z [1, N] int32 zero points."""
    if ASM:
        tl.static_assert(BF16, "packed pairs run in PTX for bfloat16 x only")
        p0, p1, p2, p3 = (
            tl.broadcast_to(p0, w.shape),
            tl.broadcast_to(p1, w.shape),
            tl.broadcast_to(p2, w.shape),
            tl.broadcast_to(p3, w.shape),
        )
        m = tl.broadcast_to((z | MAGIC_BF16) * 65537, w.shape)
        bits = tl.inline_asm_elementwise(
            WORD_DOT, "=r,r,r,r,r,r,r", [w, p0, p1, p2, p3, m], dtype=tl.int32, is_pure=True, pack=1
        )
        return bits.to(tl.float32, bitcast=True)
    zf = z.to(tl.float32)
    return _lane_dot(w, p0, p1, p2, p3, zf, 0, BF16) + _lane_dot(w, p0, p1, p2, p3, zf, 16, BF16)


@triton.jit
def x_pairs(a, b, ASM: tl.constexpr):
    """x's words a = (x0, x1) and b = (x4, x5), low half first -> the pairs (x0, x4), (x1, x5)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $2, $3, 0x5410; prmt.b32 $1, $2, $3, 0x7632;",
            "=r,=r,r,r",
            [a, b],
            dtype=(tl.int32, tl.int32),
            is_pure=True,
            pack=1,
        )
    return (a & 0xFFFF) | (b << 16), ((a >> 16) & 0xFFFF) | (b & -65536)


@triton.jit
def pairs_step(packed, z, x_words, BF16: tl.constexpr, ASM: tl.constexpr):
    """sum over a step of (q - zero) * x, [BLOCK_N] float32: packed [BLOCK_K / 8, BLOCK_N] words,
    z [BLOCK_N] int32 zero points, x_words [BLOCK_K / 8] int32 pointers to x[8i], x[8i + 1]."""
    p0, p1 = x_pairs(tl.load(x_words), tl.load(x_words + 2), ASM)
    p2, p3 = x_pairs(tl.load(x_words + 1), tl.load(x_words + 3), ASM)
    d = word_dots(packed, p0[:, None], p1[:, None], p2[:, None], p3[:, None], z[None, :], BF16, ASM)
    return tl.sum(d, axis=0)
