"""The launch configurations of the decode-size weight GEMMs (fp8_weight_matmul.py, int4_matmul.py),
and the per-shape tables their wrappers consult when the caller names none.

A product of M rows against a weight [N, K] is a read of the weight at decode sizes, and how fast
it reads depends on the tile (BLOCK_N output rows by BLOCK_K inputs a step), the warps and
pipeline stages a program runs with, and how many shares K is cut into (split_k_sum.py): one
fixed configuration reached about 57 % of the copy rate for the FP8 kernel at M = 1 and 25 % for
int4 (docs/performance.md, issue 47). tools/kernel_quant_sweep.py times the candidates at
Llama-3-8B's projections for M = 1, 4 and 16 on an H200 and prints the entries of FP8_TILES and
INT4_TILES below; a shape (or M bucket) not in a table runs its kernel's default. The wrappers
look the table up on the host when they launch, so a CUDA graph captures the configuration its
batch size chose.

A Tile with dot=False runs the kernels' FMA reduction instead of tl.dot: a tl.dot operand has at
least 16 rows, so at M = 1 fifteen sixteenths of its tensor-core work is padding, while the FMA
path multiplies the float32 weight tile by each of the batch's rows (BLOCK_M the batch rounded up
to a power of two) and sums over K, which can stream the weight faster. It serves at most
FMA_MAX_M rows (the wrappers refuse more); its tiles may be as small as 8.
"""

from __future__ import annotations

from dataclasses import dataclass

WARPS = (1, 2, 4, 8, 16)
M_BUCKETS = (1, 4, 16, 32, 64, 128, 256)  # a product of M rows takes the first bucket >= M; past the last, None
FMA_MAX_M = 4  # the most rows a dot=False tile serves: its registers grow with BLOCK_M


@dataclass(frozen=True)
class Tile:
    """One launch of a weight GEMM: BLOCK_N x BLOCK_K weight tiles (powers of two, at least 16 for
    a tl.dot operand, at least 8 for the FMA path), num_warps, num_stages, split shares of K
    (None: choose_split's), and dot: tl.dot on tensor cores, or (False) the FMA reduction of
    products of at most FMA_MAX_M rows; x8 (FP8 weights only): the activations quantized per
    token to e4m3 and the dot run e4m3 against e4m3."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split: int | None = None
    dot: bool = True
    x8: bool = False

    def __post_init__(self) -> None:
        least = 16 if self.dot else 8
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < least or v & (v - 1):
                raise ValueError(f"Tile: {name} must be a power of two of at least {least}, got {v}")
        if self.num_warps not in WARPS or self.num_stages < 1:
            raise ValueError(f"Tile: num_warps in {WARPS} and num_stages >= 1, got {self.num_warps}, {self.num_stages}")
        if self.split is not None and self.split < 1:
            raise ValueError(f"Tile: split must be None or at least 1, got {self.split}")
        if self.x8 and not self.dot:
            raise ValueError("Tile: x8 (e4m3 activations on the FP8 tensor cores) needs dot=True")


# the configurations every product ran with before the tables
FP8_DEFAULT = Tile(block_n=64, block_k=128, num_warps=4, num_stages=4)
INT4_DEFAULT = Tile(block_n=64, block_k=128, num_warps=4, num_stages=3)

TileTable = dict[tuple[int, int, int | None], Tile]  # (N, K, M bucket) -> Tile


def check_rows(kernel: str, t: Tile, m: int) -> None:
    """Refuse a dot=False tile for a product of more than FMA_MAX_M rows (the tables never hold
    one past the bucket of FMA_MAX_M; a caller's tile that does is an error, not a silent swap)."""
    if not t.dot and m > FMA_MAX_M:
        raise ValueError(f"{kernel}: a dot=False tile serves at most {FMA_MAX_M} rows, got {m}")


# Filled from `bash tools/gpu_run.sh OUT quant-sweep` (tools/kernel_quant_sweep.py; H200): its
# printed table, entries whose best beat the default by a margin. Swept on an H200 on 2026-12-04
# (docs/performance/quant-sweep.json). The FP8 entries past 16 rows beat torch._scaled_mm, which
# runs the rest (`ROWS=32,64,128,256 SWEEP_VARIANTS=fp8`, 2026-12-04: quant-sweep-x8.json); the
# entries at M = 4 and 16 were swept again with the x8 tiles among the candidates (ROWS=4,16:
# quant-sweep-x8-small.json).
FP8_TILES: TileTable = {  # (N, K, M bucket): Tile(BLOCK_N, BLOCK_K, warps, stages, split)
    (6144, 4096, 1): Tile(8, 512, 8, 1, None, dot=False),  # qkv: 9.5 us, default 15.4
    (6144, 4096, 4): Tile(128, 128, 4, 4, 4, x8=True),  # qkv: 12.9 us, default 15.6
    (6144, 4096, 16): Tile(64, 128, 4, 4, 4, x8=True),  # qkv: 13.9 us, default 16.3
    (6144, 4096, 32): Tile(64, 128, 4, 4, 4, x8=True),  # qkv: 14.1 us, _scaled_mm 21.2
    (6144, 4096, 64): Tile(128, 256, 8, 4, 2, x8=True),  # qkv: 16.2 us, _scaled_mm 18.8
    (4096, 4096, 1): Tile(64, 256, 8, 3, 8, dot=False),  # o: 7.9 us, default 12.2
    (4096, 4096, 4): Tile(64, 64, 2, 4, 8),  # o: 10.4 us, default 12.3
    (4096, 4096, 16): Tile(64, 64, 2, 4, 8),  # o: 10.8 us, default 12.3
    (4096, 4096, 32): Tile(64, 128, 4, 3, None),  # o: 12.1 us, _scaled_mm 18.1
    (4096, 4096, 64): Tile(64, 256, 4, 4, None, x8=True),  # o: 13.4 us, _scaled_mm 18.1
    (4096, 4096, 128): Tile(64, 256, 4, 4, None, x8=True),  # o: 14.0 us, _scaled_mm 18.2
    (28672, 4096, 1): Tile(32, 256, 4, 3, 1, dot=False),  # gate_up: 29.7 us, default 48.4
    (28672, 4096, 4): Tile(32, 128, 2, 4, None, x8=True),  # gate_up: 35.3 us, default 48.9
    (28672, 4096, 16): Tile(32, 128, 2, 4, 1, x8=True),  # gate_up: 36.1 us, default 50.0
    (28672, 4096, 32): Tile(32, 128, 2, 4, 1, x8=True),  # gate_up: 38.9 us, _scaled_mm 50.8
    (28672, 4096, 64): Tile(128, 128, 8, 4, 1, x8=True),  # gate_up: 38.5 us, _scaled_mm 48.9
    (4096, 14336, 1): Tile(64, 256, 8, 4, None, dot=False),  # down: 17.9 us, default 28.7
    (4096, 14336, 4): Tile(32, 128, 2, 4, 8),  # down: 24.6 us, default 29.1
    (4096, 14336, 16): Tile(64, 128, 2, 4, 8),  # down: 25.0 us, default 29.9
    (4096, 14336, 32): Tile(64, 128, 4, 3, 4),  # down: 29.2 us, _scaled_mm 49.6
    (4096, 14336, 64): Tile(128, 256, 8, 4, 4, x8=True),  # down: 33.3 us, _scaled_mm 49.4
    (4096, 14336, 128): Tile(64, 128, 4, 4, None, x8=True),  # down: 37.7 us, _scaled_mm 49.7
}
# group size 128: an entry whose block_k does not divide a weight's group is passed over
INT4_TILES: TileTable = {  # (N, K, M bucket): Tile(BLOCK_N, BLOCK_K, warps, stages, split)
    (6144, 4096, 1): Tile(64, 64, 1, 3, 32, dot=False),  # qkv: 9.0 us in bf16 pairs on an H100 (old: 11.0)
    (6144, 4096, 4): Tile(128, 64, 4, 3, None),  # qkv: 16.8 us, default 21.7
    (6144, 4096, 16): Tile(64, 128, 2, 3, 8),  # qkv: 17.4 us, default 19.2
    (4096, 4096, 1): Tile(32, 128, 2, 3, 16, dot=False),  # o: 7.5 us in pairs on an H100 (old: 9.2)
    (4096, 4096, 4): Tile(128, 64, 4, 3, None),  # o: 13.0 us, default 16.3
    (4096, 4096, 16): Tile(32, 128, 2, 3, 8),  # o: 14.2 us, default 15.8
    (28672, 4096, 1): Tile(64, 64, 1, 3, 8, dot=False),  # gate_up: 25.9 us in pairs on an H100 (old: 34.7)
    (28672, 4096, 4): Tile(64, 64, 2, 3, 4),  # gate_up: 59.4 us, default 77.1
    (28672, 4096, 16): Tile(64, 64, 2, 3, 4),  # gate_up: 61.1 us, default 77.3
    (4096, 14336, 1): Tile(64, 64, 1, 3, 32, dot=False),  # down: 16.6 us in pairs on an H100 (old: 21.9)
    (4096, 14336, 4): Tile(128, 64, 4, 3, None),  # down: 33.2 us, default 42.7
    (4096, 14336, 16): Tile(64, 128, 2, 3, 8),  # down: 33.7 us, default 43.1
}


def m_bucket(m: int) -> int | None:
    """The M bucket of a product of m rows: the first of M_BUCKETS at least m, None past them."""
    return next((b for b in M_BUCKETS if m <= b), None)


def lookup(table: TileTable, default: Tile, m: int, n: int, k: int) -> Tile:
    """The table's Tile for an [m, k] @ [n, k].t() product, default when the shape is not in it."""
    return table.get((n, k, m_bucket(m)), default)


def has_tile(table: TileTable, m: int, n: int, k: int) -> bool:
    """Whether the table holds an entry for an [m, k] @ [n, k].t() product."""
    return (n, k, m_bucket(m)) in table
