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
"""

from __future__ import annotations

from dataclasses import dataclass

WARPS = (1, 2, 4, 8, 16)
M_BUCKETS = (1, 4, 16)  # a product of M rows takes the first bucket >= M; past the last, None


@dataclass(frozen=True)
class Tile:
    """One launch of a weight GEMM: BLOCK_N x BLOCK_K weight tiles (powers of two, at least 16: a
    tl.dot operand), num_warps, num_stages, and split shares of K (None: choose_split's)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"Tile: {name} must be a power of two of at least 16, got {v}")
        if self.num_warps not in WARPS or self.num_stages < 1:
            raise ValueError(f"Tile: num_warps in {WARPS} and num_stages >= 1, got {self.num_warps}, {self.num_stages}")
        if self.split is not None and self.split < 1:
            raise ValueError(f"Tile: split must be None or at least 1, got {self.split}")


# the configurations every product ran with before the tables
FP8_DEFAULT = Tile(block_n=64, block_k=128, num_warps=4, num_stages=4)
INT4_DEFAULT = Tile(block_n=64, block_k=128, num_warps=4, num_stages=3)

TileTable = dict[tuple[int, int, int | None], Tile]  # (N, K, M bucket) -> Tile

# Filled from `bash tools/gpu_run.sh OUT quant-sweep` (tools/kernel_quant_sweep.py; H200): its
# printed table, entries whose best beat the default by a margin. Swept on an H200 on 2026-12-04
# (docs/performance/quant-sweep.json).
FP8_TILES: TileTable = {  # (N, K, M bucket): Tile(BLOCK_N, BLOCK_K, warps, stages, split)
    (6144, 4096, 1): Tile(64, 128, 2, 3, 8),  # qkv: 12.8 us, default 15.6
    (6144, 4096, 4): Tile(64, 128, 2, 2, 8),  # qkv: 14.1 us, default 16.3
    (6144, 4096, 16): Tile(64, 128, 2, 3, 8),  # qkv: 14.3 us, default 16.4
    (4096, 4096, 1): Tile(64, 64, 2, 4, 8),  # o: 10.4 us, default 12.2
    (4096, 4096, 4): Tile(64, 64, 2, 4, 8),  # o: 10.4 us, default 12.3
    (4096, 4096, 16): Tile(32, 128, 2, 3, 8),  # o: 10.8 us, default 12.4
    (28672, 4096, 1): Tile(64, 128, 2, 4, 4),  # gate_up: 43.0 us, default 48.7
    (28672, 4096, 4): Tile(32, 128, 2, 3, 8),  # gate_up: 43.1 us, default 49.0
    (28672, 4096, 16): Tile(64, 128, 2, 4, 4),  # gate_up: 45.6 us, default 50.2
    (4096, 14336, 1): Tile(64, 128, 2, 3, 8),  # down: 24.1 us, default 28.9
    (4096, 14336, 4): Tile(32, 128, 2, 4, 8),  # down: 24.7 us, default 29.1
    (4096, 14336, 16): Tile(64, 128, 2, 4, 8),  # down: 25.2 us, default 29.7
}
# group size 128: an entry whose block_k does not divide a weight's group is passed over
INT4_TILES: TileTable = {  # (N, K, M bucket): Tile(BLOCK_N, BLOCK_K, warps, stages, split)
    (6144, 4096, 1): Tile(128, 64, 4, 3, None),  # qkv: 16.8 us, default 21.8
    (6144, 4096, 4): Tile(128, 64, 4, 3, None),  # qkv: 16.8 us, default 21.9
    (6144, 4096, 16): Tile(64, 128, 2, 3, 8),  # qkv: 17.6 us, default 19.1
    (4096, 4096, 1): Tile(128, 64, 4, 3, None),  # o: 12.9 us, default 16.0
    (4096, 4096, 4): Tile(64, 64, 2, 3, 16),  # o: 12.9 us, default 16.1
    (4096, 4096, 16): Tile(32, 128, 2, 3, 8),  # o: 14.3 us, default 15.6
    (28672, 4096, 1): Tile(64, 64, 2, 3, 8),  # gate_up: 58.8 us, default 75.5
    (28672, 4096, 4): Tile(64, 64, 2, 4, 4),  # gate_up: 59.4 us, default 76.5
    (28672, 4096, 16): Tile(64, 64, 2, 3, 4),  # gate_up: 60.3 us, default 77.0
    (4096, 14336, 1): Tile(128, 64, 4, 3, None),  # down: 32.9 us, default 42.2
    (4096, 14336, 4): Tile(128, 64, 4, 3, None),  # down: 33.1 us, default 42.5
    (4096, 14336, 16): Tile(64, 128, 2, 3, 8),  # down: 33.7 us, default 42.7
}


def m_bucket(m: int) -> int | None:
    """The M bucket of a product of m rows: the first of M_BUCKETS at least m, None past them."""
    return next((b for b in M_BUCKETS if m <= b), None)


def lookup(table: TileTable, default: Tile, m: int, n: int, k: int) -> Tile:
    """The table's Tile for an [m, k] @ [n, k].t() product, default when the shape is not in it."""
    return table.get((n, k, m_bucket(m)), default)
