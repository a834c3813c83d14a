"""The norms' and silu_mul's e4m3 rows through a whole model: with TritonOps(fp8_rows=True) the
FP8 products of a prefill past 32 rows read the rows their x's kernel stored, not a launch of
fp8_quant_rows of their own, and the tokens are the same as without them. On the CPU, under the
interpreter: the x8 tiles are switched on for the tiny model's shapes (as FP8_TILES holds them for
Llama-3-8B's) and fp8_triton is made to say yes."""

from __future__ import annotations

import pytest

from services.worker.build import build_engine
from services.worker.kernels import fp8_weight_matmul as matmul_module
from services.worker.kernels.gemm_tiles import FP8_TILES, Tile
from services.worker.kernels.triton_ops import TritonOps
from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.layers import fp8_product
from shared.config import WorkerConfig
from tests.worker.engine_driver import request, run
from tools import make_tiny_model


def test_products_take_the_rows_and_give_the_same_tokens(tmp_path, monkeypatch) -> None:
    model_dir = str(tmp_path / "llama")
    make_tiny_model.main(["--arch", "llama", "--out", model_dir, "--seed", "7"])
    config = WorkerConfig(model_dir=model_dir, quantization="fp8", dtype="bfloat16")
    model = build_engine(config).runner.model
    shapes = {tuple(w.shape) for layer in model.w.layers for w in vars(layer).values() if isinstance(w, Fp8Weight)}
    assert len(shapes) == 4  # qkv, o, gate_up, down
    for n, k in shapes:
        monkeypatch.setitem(FP8_TILES, (n, k, 64), Tile(16, 32, 2, 1, None, x8=True))
    monkeypatch.setattr(fp8_product, "fp8_triton", lambda device: True)
    launches = []
    own = matmul_module.fp8_quant_rows
    monkeypatch.setattr(matmul_module, "fp8_quant_rows", lambda x: launches.append(x.shape) or own(x))

    prompt = [(7 * i) % 900 + 50 for i in range(40)]  # one prefill of 40 rows: the 64-row bucket
    tokens, counts = {}, {}
    for fp8_rows in (False, True):  # an engine each: the second would find the prompt in its cache
        engine = build_engine(config)
        engine.runner.model.ops = TritonOps(fp8_rows=fp8_rows)
        launches.clear()
        tokens[fp8_rows] = run(engine, [request("a", prompt, max_new_tokens=3)])["a"].tokens
        counts[fp8_rows] = sum(1 for s in launches if s[0] == len(prompt))
    layers = len(model.w.layers)
    assert counts[False] == 4 * layers  # every product of the prefill quantized its own x
    assert counts[True] == layers  # o alone: attention writes its x
    assert tokens[True] == tokens[False] and len(tokens[True]) == 3


@pytest.fixture(autouse=True)
def _no_leftover_tiles():
    yield
    assert not any(b == 64 and n < 512 for n, _, b in FP8_TILES)
