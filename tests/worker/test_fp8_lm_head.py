"""--fp8-lm-head: the output layer in FP8 beside FP8, AWQ or GPTQ projections. Greedy tokens equal
Hugging Face's on the weights as served (the output layer dequantized too); a tied output layer
becomes an FP8 copy while the embedding stays; without quantized weights the flag is refused."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.worker.build import build_engine
from services.worker.models.fp8_weight import Fp8Weight
from shared.config import WorkerConfig
from tests import hf_reference
from tests.quant_models import INT4, dequantized_copy, quantization_flag
from tests.worker.engine_driver import request, run
from tests.worker.test_engine_vs_hf import PROMPTS
from tools import make_tiny_model


def test_an_fp8_output_layer_gives_hf_tokens_on_its_dequantized_weights(tmp_path) -> None:
    model_dir, reference = str(tmp_path / "llama"), str(tmp_path / "served")
    make_tiny_model.main(["--arch", "llama", "--out", model_dir, "--seed", "5"])
    dequantized_copy(model_dir, reference, at_load=True)
    _fp8_output_layer(reference)
    engine = build_engine(WorkerConfig(model_dir=model_dir, quantization="fp8", fp8_lm_head=True))
    w = engine.runner.model.w
    assert isinstance(w.lm_head, Fp8Weight) and isinstance(w.embed, torch.Tensor)
    _same_tokens_as_hf(engine, reference)


def _fp8_output_layer(reference: str) -> None:
    """The reference checkpoint's output layer as served: quantized to FP8 and back."""
    path = os.path.join(reference, "model.safetensors")
    tensors = load_file(path)
    tensors["lm_head.weight"] = Fp8Weight.quantize(tensors["lm_head.weight"]).dequantize()
    save_file(tensors, path, metadata={"format": "pt"})


def _same_tokens_as_hf(engine, reference: str) -> None:
    tok = hf_reference.tokenizer(reference)
    reqs, want = [], {}
    for i, text in enumerate(PROMPTS[:4]):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=6))
        want[str(i)] = hf_reference.greedy(reference, ids, 6)
    assert {rid: o.tokens for rid, o in run(engine, reqs).items()} == want


@pytest.mark.parametrize("name", INT4)
def test_an_int4_model_takes_an_fp8_output_layer(tiny_quant: dict[str, str], name: str, tmp_path) -> None:
    """AWQ and GPTQ checkpoints too: their projections in int4, the output layer in FP8."""
    reference = str(tmp_path / "served")
    shutil.copytree(tiny_quant[name + "-dequantized"], reference)
    _fp8_output_layer(reference)
    config = WorkerConfig(model_dir=tiny_quant[name], quantization=quantization_flag(name), fp8_lm_head=True)
    engine = build_engine(config)
    assert isinstance(engine.runner.model.w.lm_head, Fp8Weight)
    _same_tokens_as_hf(engine, reference)


def test_a_tied_output_layer_gets_its_own_fp8_copy(tmp_path) -> None:
    model_dir = str(tmp_path / "gemma2")
    make_tiny_model.main(["--arch", "gemma2", "--out", model_dir, "--seed", "5"])
    engine = build_engine(WorkerConfig(model_dir=model_dir, quantization="fp8", fp8_lm_head=True))
    w = engine.runner.model.w
    assert isinstance(w.lm_head, Fp8Weight) and isinstance(w.embed, torch.Tensor)
    assert w.lm_head.shape == w.embed.shape
    assert run(engine, [request("a", [5, 6, 7], max_new_tokens=3)])["a"].finish_reason


def test_without_fp8_weights_the_flag_is_refused(tmp_path) -> None:
    model_dir = str(tmp_path / "llama")
    make_tiny_model.main(["--arch", "llama", "--out", model_dir, "--seed", "5"])
    with pytest.raises(ValueError, match="--fp8-lm-head needs quantized weights"):
        build_engine(WorkerConfig(model_dir=model_dir, fp8_lm_head=True))
