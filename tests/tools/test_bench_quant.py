"""tools/bench_quant.py end to end on the tiny model on the CPU: each variant runs the static and
prefill parts (offline is benchmark_engine's, tested with it) with its own weights and KV pool,
and the ratios to bf16 are written."""

from __future__ import annotations

import json
import os

import pytest

from services.worker.models.bench_shapes import SHAPES
from services.worker.models.fp8_weight import Fp8Weight
from tools import bench_quant, make_tiny_model
from tools.engine_factory import EngineFactory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("bench-quant") / "tiny")
    make_tiny_model.main(["--out", path, "--hidden", "128", "--intermediate", "256", "--seed", "0"])
    return path


def test_every_variant_in_one_job(tiny: str, tmp_path) -> None:
    out = tmp_path / "quant.json"
    flags = [
        "--model-dir",
        tiny,
        "--device",
        "cpu",
        "--parts",
        "static",
        "--static",
        "2x16",
        "--static-steps",
        "3",
    ]
    res = bench_quant.main(["--out", str(out), "--variants", "fp8+kv-fp8,bf16,kv-fp8", "--prefill", "2x32", *flags])
    assert res["variants"] == ["bf16", "kv-fp8", "fp8+kv-fp8"]  # bf16 weights first
    for name, (quantization, kv) in ((v, bench_quant.VARIANTS[v]) for v in res["variants"]):
        run = res["by_variant"][name]
        assert run["engine"]["quantization"] == quantization and run["engine"]["kv_dtype"] == kv
        assert run["static"][0]["batch"] == 2 and run["static"][0]["ms_per_step"] > 0
        assert run["prefill"]["prompts"] == 2 and run["prefill"]["prompt_tok_per_s"] > 0
    ratios = res["over_bf16"]
    assert set(ratios) == {"kv-fp8", "fp8+kv-fp8"}
    assert all(r["decode_ms_2x16"] > 0 and r["prefill_prompt_tok_per_s"] > 0 for r in ratios.values())
    assert json.loads(out.read_text())["over_bf16"] == ratios


def test_unknown_variants_are_refused(tmp_path) -> None:
    with pytest.raises(SystemExit):
        bench_quant.main(["--out", str(tmp_path / "x.json"), "--variants", "bf16,int4"])


def test_random_weights_are_quantized_in_place_after_the_bf16_builds(tiny: str, monkeypatch) -> None:
    """Without --model-dir the variants share one draw: bf16 engines read it as drawn, then the FP8
    variant's build quantizes its projections (so the bf16 tensors' memory is freed)."""
    with open(os.path.join(tiny, "config.json")) as f:
        monkeypatch.setitem(SHAPES, "tiny-test", json.load(f))
    _, args = bench_quant.parse_args(["--out", "unused.json", "--shape", "tiny-test", "--device", "cpu"])
    factory = EngineFactory(args)
    for quantization, want in (("none", False), ("fp8", True)):
        args.quantization = quantization
        built = factory.build(cache_on=True)
        layers = built.engine.runner.model.w.layers
        assert all(isinstance(layer.down, Fp8Weight) == want for layer in layers)
        factory.release(built)
