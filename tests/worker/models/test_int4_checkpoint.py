"""AWQ and GPTQ checkpoints read as Int4Weight: the bit layouts as published, loading equal to the
dequantized weights, each tensor-parallel rank's share, and configs refused."""

from __future__ import annotations

import pytest
import torch

from services.worker.models.int4_formats import (
    AWQ_ORDER,
    from_awq,
    from_gptq,
    from_w4a16,
    quantization_config,
    quantize_weight,
)
from services.worker.models.int4_weight import Int4Weight
from services.worker.models.registry import load_weights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig
from shared.quant_config import QuantConfigError, WeightQuant, parse_quantization

K, N, G = 64, 16, 32


def _words(rows: int, cols: int) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, (rows, cols), dtype=torch.int64).to(torch.int32)


def _nibble(word: torch.Tensor, i: int) -> int:
    return (int(word) >> (4 * i)) & 0xF


def test_awq_layout_as_autoawq_packs_it() -> None:
    """Nibble i of a word holds column 8w + AWQ_ORDER[i], for weights and zero points alike."""
    qweight, qzeros, scales = _words(K, N // 8), _words(K // G, N // 8), torch.rand(K // G, N) + 0.5
    got = from_awq(qweight, qzeros, scales, G).dequantize(torch.float32)  # [N, K]
    for k in range(0, K, 7):
        for n in range(N):
            i = AWQ_ORDER.index(n % 8)
            q, z = _nibble(qweight[k, n // 8], i), _nibble(qzeros[k // G, n // 8], i)
            assert got[n, k] == (q - z) * scales[k // G, n]


def test_gptq_layout_as_auto_gptq_packs_it() -> None:
    """Input row 8i + j at bits 4j of qweight's word i; zero points by column, stored minus one."""
    qweight, qzeros, scales = _words(K // 8, N), _words(K // G, N // 8), torch.rand(K // G, N) + 0.5
    got = from_gptq(qweight, qzeros, scales, G).dequantize(torch.float32)
    for k in range(0, K, 5):
        for n in range(N):
            q, z = _nibble(qweight[k // 8, n], k % 8), _nibble(qzeros[k // G, n // 8], n % 8) + 1
            assert got[n, k] == (q - z) * scales[k // G, n]


def test_w4a16_layout_as_compressed_tensors_packs_it() -> None:
    """weight_packed [N, K / 8]: input column 8i + j at bits 4j of word i, each a signed value
    plus 8; weight_scale [N, K / G]. W = (code - 8) * scale."""
    packed, scale = _words(N, K // 8), torch.rand(N, K // G) + 0.5
    got = from_w4a16(packed, scale, G).dequantize(torch.float32)
    for k in range(0, K, 3):
        for n in range(N):
            assert got[n, k] == (_nibble(packed[n, k // 8], k % 8) - 8) * scale[n, k // G]


def test_w4a16_config_as_llm_compressor_writes_it() -> None:
    """The W4A16 preset's quantization_config; group and asymmetric schemes are refused by name."""
    cfg = quantization_config("w4a16", 128)
    assert parse_quantization({"quantization_config": cfg}) == WeightQuant("w4a16", 4, 128)
    weights = cfg["config_groups"]["group_0"]["weights"]
    for change, found in (({"symmetric": False}, "symmetric False"), ({"actorder": "group"}, "actorder 'group'")):
        bad = {**cfg, "config_groups": {"group_0": {**cfg["config_groups"]["group_0"], "weights": weights | change}}}
        with pytest.raises(QuantConfigError, match=found):
            parse_quantization({"quantization_config": bad})


def _load(model_dir: str, rank: int = 0, size: int = 1):
    cfg = ModelConfig.from_dir(model_dir)
    return load_weights(model_dir, cfg, torch.float32, "cpu", TensorParallel(rank, size), progress=False)


@pytest.mark.parametrize(
    ("method", "size"), [("awq", 1), ("gptq", 1), ("w4a16", 1), ("awq-g32", 2), ("gptq-g32", 2), ("w4a16-g32", 2)]
)
def test_loading_equals_the_dequantized_weights(tiny_quant: dict[str, str], method: str, size: int) -> None:
    """Each rank's int4 share (rows of qkv and gate_up, columns of o and down) dequantizes to
    the same rank's share of the dequantized checkpoint."""
    for rank in range(size):
        quant, plain = _load(tiny_quant[method], rank, size), _load(tiny_quant[method + "-dequantized"], rank, size)
        for got, want in zip(quant.layers, plain.layers, strict=True):
            for name in ("qkv", "o", "gate_up", "down"):
                w = getattr(got, name)
                assert isinstance(w, Int4Weight) and w.shape == getattr(want, name).shape
                torch.testing.assert_close(w.dequantize(), getattr(want, name), rtol=0, atol=0)
        torch.testing.assert_close(quant.lm_head, plain.lm_head, rtol=0, atol=0)


def test_inputs_that_split_in_partial_groups_are_refused() -> None:
    w = Int4Weight(
        torch.zeros(128 // 8, 8, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.uint8), torch.ones(1, 8), 128
    )
    with pytest.raises(ValueError, match="whole groups of 128"):
        w.chunk(2, dim=1)


def test_a_split_by_outputs_is_the_dequantized_weights_split() -> None:
    """Phi-3's fused q | k | v: parts of 24, 8 and 8 outputs, each its rows of the whole."""
    w = quantize_weight(torch.randn(40, 64), 32, symmetric=False)
    parts = w.split([24, 8, 8])
    for part, want in zip(parts, w.dequantize().split([24, 8, 8]), strict=True):
        torch.testing.assert_close(part.dequantize(), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="outputs only"):
        w.split([32, 32], dim=1)


@pytest.mark.parametrize(
    ("q", "found"),
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}, "desc_act True"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "8 bits"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "'gemv'"),
        ({"quant_method": "bitsandbytes", "bits": 4}, "'bitsandbytes'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 100}, "group size 100"),
    ],
)
def test_unsupported_quantization_is_refused(q: dict, found: str) -> None:
    with pytest.raises(QuantConfigError, match=found) as e:
        parse_quantization({"quantization_config": q})
    assert "supported" in str(e.value)
