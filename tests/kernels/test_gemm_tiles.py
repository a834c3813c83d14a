"""The weight GEMMs' launch configurations: a Tile refuses what no kernel can launch, and the
tables give a shape's entry for its M bucket, the default for any other shape or bucket."""

from __future__ import annotations

import pytest

from services.worker.kernels.gemm_tiles import (
    FMA_MAX_M,
    FP8_DEFAULT,
    FP8_TILES,
    INT4_DEFAULT,
    INT4_TILES,
    Tile,
    check_rows,
    lookup,
    m_bucket,
)


@pytest.mark.parametrize(
    "fields",
    [
        (8, 128, 4, 4),  # a dot operand of 8 rows
        (64, 96, 4, 4),
        (64, 128, 3, 4),
        (64, 128, 4, 0),
        (64, 128, 4, 4, 0),
        (4, 128, 1, 2, None, False),  # an FMA tile below 8
        (8, 96, 1, 2, None, False),
    ],
)
def test_tile_refuses_what_cannot_launch(fields: tuple) -> None:
    with pytest.raises(ValueError, match="Tile"):
        Tile(*fields)


def test_tile_fields() -> None:
    """The tables' literal form (no dot field) is a dot tile; an FMA tile may be as small as 8."""
    assert Tile(64, 128, 2, 3, 8).dot
    fma = Tile(8, 8, 1, 1, 4, dot=False)
    assert not fma.dot and fma == Tile(8, 8, 1, 1, 4, False)


def test_fma_tiles_serve_few_rows() -> None:
    fma = Tile(16, 256, 4, 3, dot=False)
    check_rows("k", fma, FMA_MAX_M)
    check_rows("k", FP8_DEFAULT, 300)
    with pytest.raises(ValueError, match="k: a dot=False tile serves at most"):
        check_rows("k", fma, FMA_MAX_M + 1)


def test_m_buckets() -> None:
    assert [m_bucket(m) for m in (1, 2, 4, 5, 16, 17, 64, 65, 256, 300)] == [1, 4, 4, 16, 16, 32, 64, 128, 256, None]


def test_unknown_shapes_take_the_default() -> None:
    assert lookup(FP8_TILES, FP8_DEFAULT, 1, 96, 1024) == FP8_DEFAULT
    assert lookup(INT4_TILES, INT4_DEFAULT, 16, 96, 1024) == INT4_DEFAULT


def test_a_shape_in_the_table() -> None:
    mine = Tile(block_n=32, block_k=256, num_warps=8, num_stages=3, split=4)
    table = {(4096, 14336, 4): mine}
    assert lookup(table, FP8_DEFAULT, 3, 4096, 14336) == mine
    assert lookup(table, FP8_DEFAULT, 1, 4096, 14336) == FP8_DEFAULT
    assert lookup(table, FP8_DEFAULT, 3, 4096, 4096) == FP8_DEFAULT
