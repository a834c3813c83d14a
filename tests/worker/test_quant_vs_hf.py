"""The quantized tiny models' greedy output through the engine (the CPU path: dequantize, then
PyTorch's matmul) equals Hugging Face's on the dequantized weights, token for token, and stays
close to the unquantized model's: AWQ and GPTQ int4, FP8 per channel, per tensor, per block and
made at load (--quantization fp8)."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from shared.config import WorkerConfig
from tests import hf_reference
from tests.quant_models import FP8, INT4, quantization_flag
from tests.worker.engine_driver import request, run
from tests.worker.test_engine_vs_hf import PROMPTS

QUANTIZED = [*INT4, *FP8]


def _greedy(tiny_quant: dict[str, str], name: str, prefill_budget: int = 8192, **cfg) -> tuple[dict, dict]:
    """-> (the engine's tokens, HF's on the dequantized twin), by request id."""
    tok = hf_reference.tokenizer(tiny_quant["plain"])
    reqs, want = [], {}
    for i, text in enumerate(PROMPTS):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=6 + 3 * i))
        want[str(i)] = hf_reference.greedy(tiny_quant[name + "-dequantized"], ids, 6 + 3 * i)
    config = WorkerConfig(
        model_dir=tiny_quant[name], batch_max_tokens=prefill_budget, quantization=quantization_flag(name), **cfg
    )
    engine = build_engine(config)
    got = run(engine, reqs)
    assert engine.kv.available_tokens == engine.kv.capacity
    return {rid: o.tokens for rid, o in got.items()}, want


@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("prefill_budget", [8192, 16])
def test_quantized_greedy_matches_hf_on_the_dequantized_weights(
    tiny_quant: dict[str, str], name: str, prefill_budget: int
) -> None:
    got, want = _greedy(tiny_quant, name, prefill_budget)
    assert got == want


@pytest.mark.parametrize(("name", "floor"), [("awq", 0.7), ("gptq", 0.7), *((n, 0.9) for n in FP8)])
def test_quantized_greedy_is_close_to_the_unquantized_model(
    tiny_quant: dict[str, str], name: str, floor: float
) -> None:
    """Teacher-forced top-1 against the unquantized draws: most positions agree. The tiny int4
    quantizer rounds to nearest (no AWQ scaling search, no GPTQ error compensation), on random
    weights: about 75-80 % here; the issue's 95 % is for the 1B-class model on the GPU. FP8's
    rounding is finer (3 mantissa bits per value, a scale per row)."""
    tok = hf_reference.tokenizer(tiny_quant["plain"])
    agree = total = 0
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        plain = hf_reference.greedy(tiny_quant["plain"], ids, 8, eos=False)
        quant = hf_reference.top1_teacher_forced(tiny_quant[name + "-dequantized"], ids + plain)[len(ids) - 1 : -1]
        agree += sum(a == b for a, b in zip(plain, quant, strict=True))
        total += len(plain)
    assert agree / total >= floor, f"{agree} of {total} positions agree"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_cuda_path_matches_hf(tiny_quant: dict[str, str], name: str) -> None:
    """In float32 under the decode and piecewise graphs (the Triton int4 kernel; FP8 takes the
    dequantizing product in float32, _scaled_mm being for bf16): HF's tokens on the dequantized
    weights."""
    got, want = _greedy(tiny_quant, name, device="cuda", dtype="float32")
    assert got == want
