"""tools/bench_quant.py end to end on the tiny model on the CPU: each variant runs the static and
prefill parts (offline is benchmark_engine's, tested with it) with its own weights and KV pool,
and the ratios to bf16 are written."""

from __future__ import annotations

import json
import os

import pytest

from services.worker.models.bench_shapes import SHAPES
from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.int4_weight import Int4Weight
from tests.worker.engine_driver import request, run
from tools import bench_quant, make_tiny_model
from tools.engine_factory import EngineFactory, projection_bytes


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


@pytest.mark.parametrize("variants", ["bf16,int4", "bf16,fp8,awq", "awq,gptq"])
def test_unknown_variants_and_two_weight_quantizations_are_refused(tmp_path, variants: str) -> None:
    with pytest.raises(SystemExit):
        bench_quant.main(["--out", str(tmp_path / "x.json"), "--variants", variants])


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


def test_the_int4_variant_quantizes_random_weights_and_runs(tiny: str, monkeypatch, tmp_path) -> None:
    """awq: the shared draw's projections become int4 of group size 128 after the bf16 build; the
    engine decodes and prefills on them (the CPU path: the dequantizing reference)."""
    with open(os.path.join(tiny, "config.json")) as f:
        monkeypatch.setitem(SHAPES, "tiny-test", json.load(f))
    flags = ["--shape", "tiny-test", "--device", "cpu", "--parts", "static", "--static", "2x16", "--static-steps", "3"]
    res = bench_quant.main(["--out", str(tmp_path / "q.json"), "--variants", "bf16,awq", "--prefill", "2x32", *flags])
    assert res["by_variant"]["awq"]["engine"]["quantization"] == "awq"
    assert res["over_bf16"]["awq"]["decode_ms_2x16"] > 0 and res["over_bf16"]["awq"]["prefill_prompt_tok_per_s"] > 0
    _, args = bench_quant.parse_args(["--out", "unused.json", *flags])
    args.quantization = "gptq"
    built = EngineFactory(args).build(cache_on=True)
    layers = built.engine.runner.model.w.layers
    assert all(isinstance(w, Int4Weight) and w.group_size == 128 for layer in layers for w in (layer.qkv, layer.down))
    assert projection_bytes(layers[0].qkv) == 0.5 + 3 / 128 and projection_bytes(layers[0].attn_norm) == 0


def test_fp8_lm_head_is_built_and_its_floor_counts_a_byte_a_weight(tiny: str, monkeypatch) -> None:
    """--fp8-lm-head reaches the worker's build (the output layer becomes FP8), and a static row's
    bandwidth floor then counts the output layer at one byte a weight, not two."""
    from tools.benchmark_engine import weight_bytes

    with open(os.path.join(tiny, "config.json")) as f:
        monkeypatch.setitem(SHAPES, "tiny-test", json.load(f))
    flags = ["--out", "unused.json", "--shape", "tiny-test", "--device", "cpu", "--quantization", "fp8"]
    _, args = bench_quant.parse_args([*flags, "--fp8-lm-head"])
    built = EngineFactory(args).build(cache_on=True)
    head = built.engine.runner.model.w.lm_head
    assert isinstance(head, Fp8Weight)
    cfg = built.model_cfg
    fp8_head = weight_bytes(cfg, layer_bytes=1, head_bytes=projection_bytes(head))
    assert weight_bytes(cfg, layer_bytes=1) - fp8_head == cfg.vocab_size * cfg.hidden_size


def test_fp8_lm_head_beside_random_int4_weights(tiny: str, monkeypatch) -> None:
    """The benchmark's int4 weights are quantized before the build (no checkpoint says so): the
    flag still finds quantized projections and puts the output layer in FP8."""
    with open(os.path.join(tiny, "config.json")) as f:
        monkeypatch.setitem(SHAPES, "tiny-test", json.load(f))
    flags = ["--out", "unused.json", "--shape", "tiny-test", "--device", "cpu", "--quantization", "awq"]
    _, args = bench_quant.parse_args([*flags, "--fp8-lm-head"])
    w = EngineFactory(args).build(cache_on=True).engine.runner.model.w
    assert isinstance(w.lm_head, Fp8Weight) and isinstance(w.layers[0].qkv, Int4Weight)


def test_the_int4_variant_of_a_mixture_of_experts(tmp_path, monkeypatch) -> None:
    """--quantization gptq on a mixture of experts' random weights: its routed experts become
    Int4ExpertWeights of group size 128 too, and the engine decodes on them."""
    model_dir = str(tmp_path / "moe")
    make_tiny_model.main(["--arch", "qwen3_moe", "--out", model_dir, "--hidden", "128", "--moe-intermediate", "128"])
    with open(os.path.join(model_dir, "config.json")) as f:
        monkeypatch.setitem(SHAPES, "tiny-moe", json.load(f))
    flags = ["--out", "unused.json", "--shape", "tiny-moe", "--device", "cpu", "--quantization", "gptq"]
    _, args = bench_quant.parse_args(flags)
    built = EngineFactory(args).build(cache_on=True)
    experts = [layer.experts for layer in built.engine.runner.model.w.layers if layer.experts is not None]
    assert experts and all(isinstance(e.w13, Int4ExpertWeight) and e.w2.group_size == 128 for e in experts)
    out = run(built.engine, [request("a", [5, 6, 7, 8], max_new_tokens=4)])
    assert len(out["a"].tokens) == 4
