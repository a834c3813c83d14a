"""A mixture of experts' routed experts in FP8 (Fp8ExpertWeight): quantized per expert as
Fp8Weight is, read from FP8 checkpoints and --quantization fp8 equal to the dequantized
checkpoint's experts, and each tensor-parallel rank's share of them with its scales."""

from __future__ import annotations

import pytest
import torch

from services.worker.models import moe
from services.worker.models.fp8_weight import FP8, Fp8ExpertWeight, Fp8LayoutError, Fp8Weight, quantize_layers_
from shared.model_config import ModelConfig
from tests.quant_models import dequantized_copy
from tests.worker.models.test_fp8_checkpoint import _load
from tools import make_tiny_model


def test_each_expert_is_quantized_as_an_fp8_weight() -> None:
    w = torch.randn(3, 40, 24)
    q = Fp8ExpertWeight.quantize(w)
    assert q.shape == (3, 40, 24) and q.scale.shape == (3, 40) and q.dtype == FP8
    for e in range(3):
        want = Fp8Weight.quantize(w[e])
        assert torch.equal(q[e].weight.view(torch.uint8), want.weight.view(torch.uint8))
        assert torch.equal(q[e].scale, want.scale)
        assert torch.equal(q.dequantize(torch.bfloat16)[e], want.dequantize(torch.bfloat16))


def test_a_layout_that_is_not_one_is_refused() -> None:
    with pytest.raises(Fp8LayoutError, match="e4m3 weight and float32 scale"):
        Fp8ExpertWeight(torch.zeros(2, 4, 8), torch.ones(2, 4))
    with pytest.raises(Fp8LayoutError, match=r"should be \[E, N\]"):
        Fp8ExpertWeight(torch.zeros(2, 4, 8).to(FP8), torch.ones(2, 8))


def _moe(tmp_path, kind: str) -> tuple[str, str, str]:
    """A tiny Qwen3-MoE in kind ("at-load": unquantized, served with --quantization fp8) -> (its
    directory, its dequantized twin's, the --quantization flag)."""
    model_dir, reference = str(tmp_path / kind), str(tmp_path / f"{kind}-dequantized")
    quant = [] if kind == "at-load" else ["--quant", kind, "--block-size", "32"]
    make_tiny_model.main(["--arch", "qwen3_moe", "--out", model_dir, "--seed", "5", *quant])
    dequantized_copy(model_dir, reference, at_load=kind == "at-load")
    return model_dir, reference, "fp8" if kind == "at-load" else "none"


@pytest.mark.parametrize("kind", ["fp8", "fp8-tensor", "fp8-block", "at-load"])
def test_experts_load_as_fp8_equal_to_the_dequantized_checkpoint(tmp_path, kind: str) -> None:
    """Each of two ranks' FP8 experts (rows of gate and up, columns of down) dequantize exactly to
    the same rank's share of the dequantized checkpoint."""
    model_dir, reference, flag = _moe(tmp_path, kind)
    for rank in range(2):
        quant, plain = _load(model_dir, rank, 2, flag), _load(reference, rank, 2)
        for got, want in zip(quant.layers, plain.layers, strict=True):
            assert got.experts is not None and want.experts is not None
            for name in ("w13", "w2"):
                w = getattr(got.experts, name)
                assert isinstance(w, Fp8ExpertWeight) and w.shape == getattr(want.experts, name).shape
                torch.testing.assert_close(w.dequantize(), getattr(want.experts, name), rtol=0, atol=0)


def test_a_ranks_experts_keep_the_scales_of_the_whole(tmp_path) -> None:
    """--quantization fp8 quantizes each expert before the cut: a rank's down columns hold the
    whole rows' scales (the same on both ranks), its gate and up rows their own share of them."""
    model_dir, _, _ = _moe(tmp_path, "at-load")
    whole = _load(model_dir, quantization="fp8").layers[0].experts
    shares = [_load(model_dir, r, 2, "fp8").layers[0].experts for r in range(2)]
    inter = whole.w13.shape[1] // 2
    for s in shares:
        assert torch.equal(s.w2.scale, whole.w2.scale)
    half = inter // 2  # a rank's gate rows, then its up rows
    gate = torch.cat([s.w13.scale[:, :half] for s in shares], 1)
    up = torch.cat([s.w13.scale[:, half:] for s in shares], 1)
    assert torch.equal(gate, whole.w13.scale[:, :inter]) and torch.equal(up, whole.w13.scale[:, inter:])
    assert torch.equal(torch.cat([s.w2.weight for s in shares], 2).view(torch.uint8), whole.w2.weight.view(torch.uint8))


def test_random_weights_quantized_in_place_take_fp8_experts(tmp_path) -> None:
    """quantize_layers_ (--random-weights --quantization fp8, the benchmarks): a sparse layer's
    experts become Fp8ExpertWeights, expert by expert as Fp8Weight.quantize does, beside its
    shared expert's Fp8Weights."""
    model_dir = str(tmp_path / "qwen2_moe")
    make_tiny_model.main(["--arch", "qwen2_moe", "--out", model_dir])
    layers = moe.random_weights(ModelConfig.from_dir(model_dir), torch.float32, torch.device("cpu")).layers
    before = [(layer.experts.w13.clone(), layer.experts.w2.clone()) for layer in layers if layer.experts]
    quantize_layers_(layers)
    sparse = [layer for layer in layers if layer.experts]
    assert sparse and len(sparse) == len(before)
    for layer, (w13, w2) in zip(sparse, before, strict=True):
        assert isinstance(layer.gate_up, Fp8Weight) and isinstance(layer.down, Fp8Weight)
        for got, w in ((layer.experts.w13, w13), (layer.experts.w2, w2)):
            assert isinstance(got, Fp8ExpertWeight)
            assert torch.equal(got.dequantize(), Fp8ExpertWeight.quantize(w).dequantize())
