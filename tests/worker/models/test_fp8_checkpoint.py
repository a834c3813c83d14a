"""FP8 checkpoints and --quantization fp8 read as Fp8Weight: the scale layouts as published,
loading equal to the dequantized weights, each tensor-parallel rank's share (column-parallel cuts
the per-channel scale, row-parallel keeps it whole), and configs refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from services.worker.models import fp8_formats
from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.registry import load_weights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig
from shared.quant_config import FP8_AT_LOAD, QuantConfigError, WeightQuant, parse_quantization, with_flag
from tests.quant_models import FP8, quantization_flag

N, K = 48, 80


def _load(model_dir: str, rank: int = 0, size: int = 1, quantization: str = "none"):
    cfg = ModelConfig.from_dir(model_dir)
    cfg = replace(cfg, quantization=with_flag(cfg.quantization, quantization))
    return load_weights(model_dir, cfg, torch.float32, "cpu", TensorParallel(rank, size), progress=False)


def test_quantize_puts_each_rows_absmax_on_448() -> None:
    w = torch.randn(N, K)
    q = Fp8Weight.quantize(w)
    assert q.weight.dtype == torch.float8_e4m3fn and q.scale.shape == (N,)
    assert torch.equal(q.weight.float().abs().amax(1), torch.full((N,), 448.0))
    assert ((q.dequantize() - w).abs() <= w.abs() / 16 + q.scale[:, None] * 2.0**-10).all()


def test_compressed_tensors_scales_as_published() -> None:
    """weight_scale [1] (tensor) repeated over the rows, [N, 1] (channel) one a row: W = weight * scale."""
    w = torch.randn(N, K)
    quant = WeightQuant("fp8", 8, 0, scale_name="weight_scale")
    for per_tensor in (True, False):
        t = fp8_formats.to_compressed(w, per_tensor)
        assert t["weight_scale"].shape == ((1,) if per_tensor else (N, 1))
        got = fp8_formats.read(lambda n, t=t: t[n.rsplit(".", 1)[-1]], "x.", quant)
        assert torch.equal(got.dequantize(), t["weight"].float() * t["weight_scale"])


def test_block_scales_as_published_and_quantized_again_per_channel() -> None:
    """weight_scale_inv [ceil(N / bn), ceil(K / bk)], partial blocks at the edges; the read weight
    is the block dequantization quantized per output row."""
    w = torch.randn(N, K)
    t = fp8_formats.to_block(w, (32, 32))
    assert t["weight_scale_inv"].shape == (2, 3)
    quant = WeightQuant("fp8", 8, 0, scale_name="weight_scale_inv", block=(32, 32))
    want = torch.empty(N, K)
    for n in range(N):
        for k in range(K):
            want[n, k] = t["weight"][n, k].float() * t["weight_scale_inv"][n // 32, k // 32]
    assert torch.equal(fp8_formats.dequantize(t["weight"], t["weight_scale_inv"], quant), want)
    got = fp8_formats.read(lambda n: t[n.rsplit(".", 1)[-1]], "x.", quant)
    assert torch.equal(got.dequantize(), Fp8Weight.quantize(want).dequantize())


@pytest.mark.parametrize("name", FP8)
@pytest.mark.parametrize("size", [1, 2])
def test_loading_equals_the_dequantized_weights(tiny_quant: dict[str, str], name: str, size: int) -> None:
    """Each rank's FP8 share (rows of qkv and gate_up, columns of o and down) dequantizes to the
    same rank's share of the dequantized checkpoint; the output layer and embedding stay float."""
    for rank in range(size):
        quant = _load(tiny_quant[name], rank, size, quantization_flag(name))
        plain = _load(tiny_quant[name + "-dequantized"], rank, size)
        for got, want in zip(quant.layers, plain.layers, strict=True):
            for proj in ("qkv", "o", "gate_up", "down"):
                w = getattr(got, proj)
                assert isinstance(w, Fp8Weight) and w.shape == getattr(want, proj).shape
                torch.testing.assert_close(w.dequantize(), getattr(want, proj), rtol=0, atol=0)
        assert quant.lm_head.dtype == quant.embed.dtype == torch.float32
        torch.testing.assert_close(quant.lm_head, plain.lm_head, rtol=0, atol=0)


def test_row_parallel_shares_keep_the_whole_rows_scales(tiny_quant: dict[str, str]) -> None:
    """--quantization fp8 quantizes before the cut: a rank's o and down hold the whole rows' scales
    (the same on both ranks), its qkv and gate_up its own rows' share of them."""
    whole = _load(tiny_quant["plain"], quantization="fp8").layers[0]
    shares = [_load(tiny_quant["plain"], r, 2, "fp8").layers[0] for r in range(2)]
    for s in shares:
        assert torch.equal(s.o.scale, whole.o.scale) and torch.equal(s.down.scale, whole.down.scale)
    assert torch.equal(
        torch.cat([s.gate_up.scale[: s.gate_up.shape[0] // 2] for s in shares]),
        whole.gate_up.scale[: whole.gate_up.shape[0] // 2],
    )
    assert torch.equal(torch.cat([s.o.weight for s in shares], 1).view(torch.uint8), whole.o.weight.view(torch.uint8))


@pytest.mark.parametrize(
    ("q", "found"),
    [
        ({"quant_method": "compressed-tensors", "format": "marlin-24"}, "'marlin-24'"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "pack-quantized without config_groups"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}},
            },
            "strategy 'block'",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}},
            },
            "4 bits, type 'int'",
        ),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "fmt 'e5m2'"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, r"weight_block_size \[128\]"),
    ],
)
def test_unsupported_fp8_is_refused(q: dict, found: str) -> None:
    with pytest.raises(QuantConfigError, match=found) as e:
        parse_quantization({"quantization_config": q})
    assert "supported: " in str(e.value) and "fine-grained FP8" in str(e.value)


def test_fp8_checkpoints_of_mixtures_of_experts_are_read() -> None:
    q = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert parse_quantization({"quantization_config": q}) == WeightQuant(
        "fp8", 8, 0, scale_name="weight_scale_inv", block=(128, 128)
    )


def test_the_quantization_flag() -> None:
    awq = WeightQuant("awq", 4, 128)
    fp8 = WeightQuant("fp8", 8, 0, scale_name="weight_scale")
    assert with_flag(None, "fp8") == FP8_AT_LOAD and with_flag(None, "none") is None
    assert with_flag(fp8, "fp8") == fp8 and with_flag(awq, "none") == awq
    with pytest.raises(QuantConfigError, match="--quantization fp8 on a awq 4-bit checkpoint"):
        with_flag(awq, "fp8")
