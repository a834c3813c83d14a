"""AWQ and GPTQ checkpoints beyond the dense Llama-shaped families, on the CPU: the mixtures of
experts (their routed experts int4 too, the routers not), loaded as Int4ExpertWeights equal to
the dequantized checkpoint's experts on one rank and each of two, and Phi-3 (its fused qkv_proj
and gate_up_proj quantized whole, split at load): Hugging Face's greedy tokens on the
dequantized weights through the engine, on one rank and over two."""

from __future__ import annotations

import pytest
import torch

from services.worker.models import int4_formats, moe
from services.worker.models.checkpoint import WeightLoadError
from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.int4_weight import Int4Weight
from shared.model_config import ModelConfig
from tests.quant_models import dequantized_copy
from tests.worker.models.test_fp8_checkpoint import _load
from tests.worker.test_fp8_families import check_greedy, over_two_ranks
from tools import make_tiny_model

INT4_FORMS = (Int4Weight, Int4ExpertWeight)


def _quantized(tmp_path, arch: str, method: str) -> tuple[str, str]:
    """A tiny mixture of experts as method's checkpoint, groups of 32 (the experts 64 wide: one
    group a rank over two) -> (its directory, its dequantized twin's)."""
    model_dir, reference = str(tmp_path / f"{arch}-{method}"), str(tmp_path / f"{arch}-{method}-dequantized")
    flags = ["--quant", method, "--group-size", "32", "--moe-intermediate", "64"]
    make_tiny_model.main(["--arch", arch, "--out", model_dir, "--seed", "3", *flags])
    dequantized_copy(model_dir, reference)
    return model_dir, reference


@pytest.mark.parametrize(("arch", "method"), [("mixtral", "awq"), ("qwen2_moe", "gptq"), ("qwen3_moe", "awq")])
def test_int4_checkpoints_of_mixtures_of_experts(arch: str, method: str, tmp_path) -> None:
    """Mixtral's w1/w3/w2 and the Qwen experts' gate/up/down (Qwen2-MoE's shared expert too) int4,
    the routers and the shared expert's gate unquantized: HF's greedy tokens."""
    model_dir, reference = _quantized(tmp_path, arch, method)
    cfg = ModelConfig.from_dir(model_dir)
    assert cfg.quantization is not None and cfg.quantization.method == method
    check_greedy(model_dir, reference, "none", forms=INT4_FORMS)


@pytest.mark.parametrize(
    ("arch", "method"), [("qwen2", "gptq"), ("qwen3", "awq"), ("gemma2", "gptq"), ("gemma3", "awq")]
)
def test_int4_in_the_other_dense_families(arch: str, method: str, tmp_path) -> None:
    """QKV bias, head norms, Gemma's unit-offset norms, soft-capping and sliding windows beside
    int4 projections (Llama's own: tests/worker/test_quant_vs_hf.py)."""
    model_dir, reference = _quantized(tmp_path, arch, method)
    check_greedy(model_dir, reference, "none", forms=INT4_FORMS)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_int4_phi3_splits_its_fused_projections(method: str, tmp_path) -> None:
    """qkv_proj and gate_up_proj are one int4 tensor each: split into q, k, v and gate, up by
    packed columns (Int4Weight.split), then joined again in LightStream's layout."""
    model_dir, reference = _quantized(tmp_path, "phi3", method)
    check_greedy(model_dir, reference, "none", forms=INT4_FORMS)
    if method == "gptq":
        over_two_ranks(model_dir, reference, "none", INT4_FORMS)


def test_int4_experts_load_equal_to_the_dequantized_checkpoint(tmp_path) -> None:
    """Each of two ranks' int4 experts (gate and up by output columns, down by whole groups of
    input rows) dequantize exactly to the same rank's share of the dequantized checkpoint."""
    model_dir, reference = _quantized(tmp_path, "qwen3_moe", "gptq")
    for rank, size in ((0, 1), (0, 2), (1, 2)):
        quant, plain = _load(model_dir, rank, size), _load(reference, rank, size)
        for got, want in zip(quant.layers, plain.layers, strict=True):
            assert got.experts is not None and want.experts is not None
            for name in ("w13", "w2"):
                w = getattr(got.experts, name)
                assert isinstance(w, Int4ExpertWeight) and w.shape == getattr(want.experts, name).shape
                torch.testing.assert_close(w.dequantize(torch.float32), getattr(want.experts, name), rtol=0, atol=0)


def test_int4_experts_over_two_tensor_parallel_ranks(tmp_path) -> None:
    model_dir, reference = _quantized(tmp_path, "mixtral", "awq")
    over_two_ranks(model_dir, reference, "none", INT4_FORMS)


def test_experts_that_do_not_split_in_whole_groups_are_refused(tmp_path) -> None:
    """Experts 48 wide over two ranks: 24 input rows of down a rank, not a whole group of 32."""
    model_dir = str(tmp_path / "qwen3_moe")
    flags = ["--quant", "awq", "--group-size", "32", "--moe-intermediate", "96"]
    make_tiny_model.main(["--arch", "qwen3_moe", "--out", model_dir, *flags])
    _load(model_dir, 0, 1)  # whole, it loads
    with pytest.raises(ValueError, match="whole groups of 32"):
        _load(model_dir, 0, 4)


def test_an_expert_of_another_form_is_refused() -> None:
    stack = Int4ExpertWeight.empty(2, 16, 32, 32, torch.float32, "cpu")
    with pytest.raises(WeightLoadError, match="Tensor where the experts before it are Int4ExpertWeight"):
        moe._place(stack, 1, 0, torch.zeros(16, 32))
    with pytest.raises(ValueError, match="group size 64"):
        stack.place(1, 0, int4_formats.quantize_weight(torch.randn(16, 64), 64, False))


def test_random_weights_quantized_in_place_take_int4_experts(tmp_path) -> None:
    """int4_formats.quantize_layers_ (--random-weights --quantization awq, the benchmarks): a
    sparse layer's experts become Int4ExpertWeights, each expert as quantize_weight writes it."""
    model_dir = str(tmp_path / "mixtral")
    make_tiny_model.main(["--arch", "mixtral", "--out", model_dir, "--moe-intermediate", "64"])
    layers = moe.random_weights(ModelConfig.from_dir(model_dir), torch.float32, torch.device("cpu")).layers
    before = [layer.experts.w2.clone() for layer in layers if layer.experts]
    int4_formats.quantize_layers_(layers, "gptq", 32)
    for layer, w2 in zip(layers, before, strict=True):
        got = layer.experts.w2
        assert isinstance(got, Int4ExpertWeight) and isinstance(layer.experts.w13, Int4ExpertWeight)
        for e in range(w2.shape[0]):
            want = int4_formats.quantize_weight(w2[e], 32, True).dequantize()
            torch.testing.assert_close(got[e].dequantize(), want, rtol=0, atol=0)
