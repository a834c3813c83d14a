"""The int4 tiny models' greedy output through the engine (the CPU path: dequantize, then
PyTorch's matmul) equals Hugging Face's on the dequantized weights, token for token, and stays
close to the unquantized model's."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from shared.config import WorkerConfig
from tests import hf_reference
from tests.worker.engine_driver import request, run
from tests.worker.test_engine_vs_hf import PROMPTS


def _greedy(tiny_int4: dict[str, str], name: str, prefill_budget: int = 8192) -> tuple[dict, dict]:
    """-> (the engine's tokens, HF's on the dequantized twin), by request id."""
    tok = hf_reference.tokenizer(tiny_int4["plain"])
    reqs, want = [], {}
    for i, text in enumerate(PROMPTS):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=6 + 3 * i))
        want[str(i)] = hf_reference.greedy(tiny_int4[name + "-dequantized"], ids, 6 + 3 * i)
    engine = build_engine(WorkerConfig(model_dir=tiny_int4[name], batch_max_tokens=prefill_budget))
    got = run(engine, reqs)
    assert engine.kv.available_tokens == engine.kv.capacity
    return {rid: o.tokens for rid, o in got.items()}, want


@pytest.mark.parametrize("name", ["awq", "gptq"])
@pytest.mark.parametrize("prefill_budget", [8192, 16])
def test_int4_greedy_matches_hf_on_the_dequantized_weights(
    tiny_int4: dict[str, str], name: str, prefill_budget: int
) -> None:
    got, want = _greedy(tiny_int4, name, prefill_budget)
    assert got == want


@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_int4_greedy_is_close_to_the_unquantized_model(tiny_int4: dict[str, str], name: str) -> None:
    """Teacher-forced top-1 against the unquantized draws: most positions agree. The tiny
    quantizer rounds to nearest (no AWQ scaling search, no GPTQ error compensation), on random
    weights: about 75-80 % here; the issue's 95 % is for the 1B-class model on the GPU."""
    tok = hf_reference.tokenizer(tiny_int4["plain"])
    agree = total = 0
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        plain = hf_reference.greedy(tiny_int4["plain"], ids, 8, eos=False)
        quant = hf_reference.top1_teacher_forced(tiny_int4[name + "-dequantized"], ids + plain)[len(ids) - 1 : -1]
        agree += sum(a == b for a, b in zip(plain, quant, strict=True))
        total += len(plain)
    assert agree / total >= 0.7, f"{agree} of {total} positions agree"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["awq", "gptq"])
def test_int4_cuda_path_matches_hf(tiny_int4: dict[str, str], name: str) -> None:
    """The Triton int4 kernel in float32 under the decode and piecewise graphs: HF's tokens on the
    dequantized weights."""
    tok = hf_reference.tokenizer(tiny_int4["plain"])
    reqs, want = [], {}
    for i, text in enumerate(PROMPTS):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=6 + 3 * i))
        want[str(i)] = hf_reference.greedy(tiny_int4[name + "-dequantized"], ids, 6 + 3 * i)
    engine = build_engine(WorkerConfig(model_dir=tiny_int4[name], device="cuda", dtype="float32"))
    assert {rid: o.tokens for rid, o in run(engine, reqs).items()} == want
