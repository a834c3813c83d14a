"""e4m3 rows stored by the kernel that writes an FP8 product's x (rmsnorm, add_rmsnorm, silu_mul
with rows): fp8_quant_rows' bytes exactly, the output itself unchanged; TritonOps(fp8_rows=True)
attaches them past TRITON_MAX_M rows only, and the products take them instead of quantizing x."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels import triton_ops
from services.worker.kernels.add_rmsnorm import add_rmsnorm_
from services.worker.kernels.fp8_quant_rows import Fp8Rows, attached_rows, fp8_quant_rows, with_rows
from services.worker.kernels.fp8_weight_matmul import fp8_weight_matmul
from services.worker.kernels.gemm_tiles import FP8_TILES, Tile, m_bucket
from services.worker.kernels.rmsnorm import rmsnorm
from services.worker.kernels.silu_mul import ROWS_MAX, silu_mul
from services.worker.kernels.triton_ops import TritonOps
from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.layers.fp8_product import TRITON_MAX_M, quantizes_rows
from services.worker.models.layers.ops import RowNorm

DTYPE = torch.float16


def _same_rows(out: torch.Tensor, rows: Fp8Rows) -> None:
    q, s = fp8_quant_rows(out)
    assert torch.equal(rows.q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(rows.scale, s)


@pytest.mark.parametrize(("t", "h"), [(3, 64), (5, 200)])
def test_norms_store_the_rows_fp8_quant_rows_would(t: int, h: int, device) -> None:
    x = torch.randn(t, h, device=device).to(DTYPE)
    residual = (torch.randn(t, h, device=device) * 4).to(DTYPE)
    w = torch.randn(h, device=device).to(DTYPE)
    rows = Fp8Rows.empty(t, h, device)
    out = rmsnorm(x, w, 1e-5, rows=rows)
    assert torch.equal(out, rmsnorm(x, w, 1e-5))
    _same_rows(out, rows)
    plain_residual = residual.clone()
    out = add_rmsnorm_(x, residual, w, 1e-5, rows=rows, unit_offset=True)
    assert torch.equal(out, add_rmsnorm_(x, plain_residual, w, 1e-5, unit_offset=True))
    assert torch.equal(residual, plain_residual)
    _same_rows(out, rows)


@pytest.mark.parametrize("folded", [False, True])
def test_silu_mul_stores_the_rows_in_one_program_a_row(folded: bool, device) -> None:
    t, inter = 4, 1500  # a row of 2048 lanes, 1500 of them real
    gate_up = (torch.randn(t, 2 * inter, device=device) * 3).to(DTYPE)
    norm = RowNorm(torch.randn(t, 96, device=device).to(DTYPE), 1e-5) if folded else None
    rows = Fp8Rows.empty(t, inter, device)
    out = silu_mul(gate_up, norm=norm, rows=rows)
    assert torch.equal(out, silu_mul(gate_up, norm=norm))
    _same_rows(out, rows)


def test_rows_of_the_wrong_shape_or_width_are_refused(device) -> None:
    x, w = torch.randn(3, 64, device=device).to(DTYPE), torch.ones(64, device=device).to(DTYPE)
    with pytest.raises(ValueError, match="fp8 rows"):
        rmsnorm(x, w, 1e-5, rows=Fp8Rows.empty(3, 32, device))
    wide = torch.zeros(1, 2 * (ROWS_MAX + 1), device=device).to(DTYPE)
    with pytest.raises(ValueError, match="e4m3 rows need"):
        silu_mul(wide, rows=Fp8Rows.empty(1, ROWS_MAX + 1, device))


def test_ops_attach_rows_only_where_the_products_quantize_x(device) -> None:
    ops, w = TritonOps(fp8_rows=True), torch.randn(64, device=device).to(DTYPE)
    few, many = (torch.randn(m, 64, device=device).to(DTYPE) for m in (32, 64))  # quantizes_rows: 64 only
    assert attached_rows(ops.rmsnorm(few, w, 1e-5)) is None
    out = ops.rmsnorm(many, w, 1e-5)
    _same_rows(out, attached_rows(out))
    out = ops.add_rmsnorm(many, many.clone(), w, 1e-5)
    _same_rows(out, attached_rows(out))
    out = ops.silu_mul(torch.randn(64, 128, device=device).to(DTYPE))
    _same_rows(out, attached_rows(out))
    assert attached_rows(TritonOps().rmsnorm(many, w, 1e-5)) is None  # bf16 products: no rows
    triton_ops.FUSED_ROWS = False
    try:
        assert attached_rows(ops.rmsnorm(many, w, 1e-5)) is None
    finally:
        triton_ops.FUSED_ROWS = True


def test_an_x8_product_takes_the_attached_rows(device) -> None:
    """x carrying y's rows multiplies as y does: the product read the rows, not x."""
    w = Fp8Weight.quantize(torch.randn(96, 256) * 0.06).to(device)
    x, y = (torch.randn(20, 256, device=device).to(DTYPE) for _ in range(2))
    tile = Tile(block_n=32, block_k=128, num_warps=4, num_stages=2, x8=True)
    want = fp8_weight_matmul(y, w, tile=tile)
    got = fp8_weight_matmul(with_rows(x, Fp8Rows(*fp8_quant_rows(y))), w, tile=tile)
    assert torch.equal(got, want)


@pytest.mark.parametrize("m", [1, 16, 17, 32, 33, 64, 100, 128, 129, 4096])
def test_rows_are_wanted_where_every_product_quantizes_x(m: int) -> None:
    """quantizes_rows(m): each shape's product of m rows takes an x8 tile or torch._scaled_mm
    (no tile past TRITON_MAX_M), both of which quantize x per token; at 17 to 32 rows the o and
    down products keep bf16 x, so no rows are stored there."""
    shapes = {(n, k) for n, k, _ in FP8_TILES}
    every = m > TRITON_MAX_M and all((t := FP8_TILES.get((n, k, m_bucket(m)))) is None or t.x8 for n, k in shapes)
    assert quantizes_rows(m) == every
    assert quantizes_rows(64) and not quantizes_rows(32) and not quantizes_rows(16)
