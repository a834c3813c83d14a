"""The candidates of tools/kernel_quant_sweep.py: the axes of a weight GEMM's launch (gemm_tiles.py's
Tile) and its three rounds. First every BLOCK_N x BLOCK_K x num_warps with the default's stages and
choose_split's split (and the default itself), and for M <= FMA_MAX_M the FMA (dot=False) tiles as
well; then the splits of the round's best `keep`; then the stages of the best two: at most about
60 a point, 95 where the FMA tiles join, about 110 where FP8's x8 tiles do (past one row). `valid`
drops what would not launch or would waste the GPU before anything is compiled."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from services.worker.kernels.gemm_tiles import FMA_MAX_M, FP8_DEFAULT, INT4_DEFAULT, Tile

VARIANTS = ("fp8", "int4")
DEFAULTS = {"fp8": FP8_DEFAULT, "int4": INT4_DEFAULT}
GROUP = 128  # the int4 weights' group size (AWQ's usual)
PER_THREAD = (8, 128)  # weight-tile elements a thread holds: fewer idles warps, more spills registers
SMEM_BYTES = 227 * 1024  # an H200 block's shared memory
X8_MIN_M = 1  # x8 tiles (e4m3 activations) are tried past this many rows: a row alone pays for its quantization


@dataclass(frozen=True)
class Space:
    """The candidates' axes (the fma_ ones: the dot=False tiles' at M <= FMA_MAX_M) and the
    timing's size."""

    rows: tuple[int, ...] = (1, 4, 16)
    block_n: tuple[int, ...] = (16, 32, 64, 128)
    block_k: dict[str, tuple[int, ...]] = field(default_factory=lambda: {"fp8": (64, 128, 256), "int4": (32, 64, 128)})
    warps: tuple[int, ...] = (2, 4, 8)
    stages: tuple[int, ...] = (2, 3, 4, 5)
    splits: tuple[int | None, ...] = (None, 1, 2, 4, 8, 16)
    keep: int = 3  # the best of the first round whose splits the second varies; the best checked
    replays: int = 20  # products a timed graph runs
    fma_block_n: tuple[int, ...] = (8, 16, 32, 64)
    fma_block_k: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"fp8": (128, 256, 512), "int4": (32, 64, 128)}
    )
    fma_warps: tuple[int, ...] = (1, 2, 4, 8)
    fma_stages: tuple[int, ...] = (1, 2, 3, 4)


SMOKE = Space(
    (1,),
    (16, 32),
    {"fp8": (64, 128), "int4": (32, 64)},
    (4,),
    (2,),
    (None, 2),
    2,
    1,
    fma_block_n=(8,),
    fma_block_k={"fp8": (128,), "int4": (32,)},
    fma_warps=(1,),
    fma_stages=(2,),
)


def k_steps(variant: str, k: int, t: Tile) -> int:
    return -(-k // t.block_k) if variant == "fp8" else k // t.block_k


def block_m(t: Tile, m: int) -> int:
    """The rows a program of t computes for a product of m (as split_k_sum.plan_split picks them)."""
    if t.dot:
        return 16 if m <= 16 else 32 if m <= 32 else 64
    return 1 << (m - 1).bit_length()


def valid(variant: str, t: Tile, k: int, m: int) -> bool:
    """Whether t is worth launching for a product of m rows with a weight of k inputs: the int4
    step within a group, an FMA tile only for m <= FMA_MAX_M, the weight tile's share of a thread
    in bounds (an FMA tile's products, BLOCK_M of them an element, at most PER_THREAD[1]), its
    stages' shared memory in bounds, and each share of K at least two steps."""
    if variant == "int4" and GROUP % t.block_k:
        return False
    if (not t.dot and m > FMA_MAX_M) or (t.x8 and (variant != "fp8" or m <= X8_MIN_M)):
        return False
    per_thread = t.block_n * t.block_k // (32 * t.num_warps)
    held = per_thread if t.dot else per_thread * block_m(t, m)
    if per_thread < PER_THREAD[0] or held > PER_THREAD[1]:
        return False
    weight = t.block_n * t.block_k * (1 if variant == "fp8" else 0.5)
    if t.num_stages * (weight + block_m(t, m) * t.block_k * (1 if t.x8 else 2)) > SMEM_BYTES:
        return False
    return t.split is None or t.split == 1 or k_steps(variant, k, t) // t.split >= 2


def first_round(variant: str, k: int, m: int, space: Space) -> list[Tile]:
    """Every tile and warp count with the default's stages and choose_split's split (for
    m <= FMA_MAX_M the FMA tiles too, for FP8 past X8_MIN_M rows each dot tile with e4m3
    activations too); the default."""
    d = DEFAULTS[variant]
    x8s = (False, True) if variant == "fp8" and m > X8_MIN_M else (False,)
    tiles = [
        Tile(bn, bk, w, d.num_stages, x8=x8)
        for bn in space.block_n
        for bk in space.block_k[variant]
        for w in space.warps
        for x8 in x8s
    ]
    if m <= FMA_MAX_M:
        tiles += [
            Tile(bn, bk, w, d.num_stages, dot=False)
            for bn in space.fma_block_n
            for bk in space.fma_block_k[variant]
            for w in space.fma_warps
        ]
    return [d, *(t for t in tiles if t != d and valid(variant, t, k, m))]


def next_round(rnd: int, variant: str, k: int, m: int, ranked: list[Tile], space: Space) -> list[Tile]:
    """Round 1: the splits of the best space.keep; round 2: the stages of the best two."""
    if rnd == 1:
        out = [replace(t, split=s) for t in ranked[: space.keep] for s in space.splits]
    else:
        out = [replace(t, num_stages=s) for t in ranked[:2] for s in (space.stages if t.dot else space.fma_stages)]
    return [t for t in dict.fromkeys(out) if valid(variant, t, k, m)]
