"""FP8 weights in every family the worker serves, on the CPU: --quantization fp8 on each tiny
model, and FP8 checkpoints of the mixtures of experts (their routed experts FP8 too), give
Hugging Face's greedy tokens on the weights as served, dequantized; over two ranks as well."""

from __future__ import annotations

import os

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.fp8_weight import Fp8ExpertWeight, Fp8Weight
from services.worker.tp.group import leave_group, start_group
from shared.config import WorkerConfig
from tests import hf_reference
from tests.conftest import ARCHS, MOE_ARCHS
from tests.quant_models import dequantized_copy
from tests.worker.engine_driver import request, run
from tests.worker.test_engine_vs_hf import PROMPTS
from tools import make_tiny_model


def check_greedy(
    model_dir: str, reference: str, quantization: str, engine=None, forms=(Fp8Weight, Fp8ExpertWeight)
) -> None:
    """The engine on model_dir (its projections and routed experts of forms' types) gives HF's
    greedy tokens on reference."""
    engine = engine or build_engine(WorkerConfig(model_dir=model_dir, quantization=quantization))
    dense, experts = forms
    for layer in engine.runner.model.w.layers:
        assert isinstance(layer.qkv, dense) and isinstance(layer.o, dense)
        assert layer.gate_up is None or isinstance(layer.gate_up, dense)  # a routed-only MoE layer has none
        if layer.experts is not None:  # the routed experts: quantized with their scales
            assert isinstance(layer.experts.w13, experts) and isinstance(layer.experts.w2, experts)
    tok = hf_reference.tokenizer(reference)
    reqs, want = [], {}
    for i, text in enumerate(PROMPTS[:4]):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=5 + i))
        want[str(i)] = hf_reference.greedy(reference, ids, 5 + i)
    assert {rid: o.tokens for rid, o in run(engine, reqs).items()} == want


@pytest.mark.parametrize("arch", [*ARCHS, *MOE_ARCHS])
def test_fp8_at_load_in_every_family(arch: str, tmp_path) -> None:
    model_dir = str(tmp_path / arch)
    make_tiny_model.main(["--arch", arch, "--out", model_dir, "--seed", "3"])
    reference = str(tmp_path / f"{arch}-dequantized")
    dequantized_copy(model_dir, reference, at_load=True)
    check_greedy(model_dir, reference, "fp8")


@pytest.mark.parametrize(
    ("arch", "kind"), [("mixtral", "fp8"), ("qwen2_moe", "fp8-tensor"), ("qwen3_moe", "fp8-block")]
)
def test_fp8_checkpoints_of_mixtures_of_experts(arch: str, kind: str, tmp_path) -> None:
    model_dir = str(tmp_path / arch)
    make_tiny_model.main(["--arch", arch, "--out", model_dir, "--seed", "3", "--quant", kind, "--block-size", "32"])
    reference = str(tmp_path / f"{arch}-dequantized")
    dequantized_copy(model_dir, reference)
    assert os.path.exists(os.path.join(reference, "model.safetensors"))
    check_greedy(model_dir, reference, "none")


def over_two_ranks(
    model_dir: str, reference: str, quantization: str = "fp8", forms=(Fp8Weight, Fp8ExpertWeight)
) -> None:
    """model_dir (with --quantization quantization) over two gloo ranks (rank 1 a child process),
    its tokens checked against Hugging Face's on reference."""
    cfg = WorkerConfig(model_dir=model_dir, device="cpu", tp=2, quantization=quantization, batch_max_tokens=16)
    threads = torch.get_num_threads()  # joining the group divides the cores between the ranks
    group = start_group(cfg)
    try:
        engine = build_engine(cfg, group.tp, channel=group.channel)
        check_greedy(model_dir, reference, quantization, engine, forms)
    finally:
        group.stop(join_s=20)
        leave_group()
        torch.set_num_threads(threads)


def test_fp8_over_two_tensor_parallel_ranks(tiny_quant: dict[str, str]) -> None:
    """Column-parallel shares cut the scales, row-parallel ones keep them whole, and the tokens
    are HF's on the whole model's FP8 weights, dequantized."""
    over_two_ranks(tiny_quant["plain"], tiny_quant["fp8-at-load-dequantized"])


def test_fp8_experts_over_two_tensor_parallel_ranks(tmp_path) -> None:
    """A mixture of experts: each rank's rows of every expert's gate and up with their scales,
    its columns of every down with the whole rows' scales (quantized before the cut)."""
    model_dir, reference = str(tmp_path / "mixtral"), str(tmp_path / "mixtral-dequantized")
    make_tiny_model.main(["--arch", "mixtral", "--out", model_dir, "--seed", "3"])
    dequantized_copy(model_dir, reference, at_load=True)
    over_two_ranks(model_dir, reference)
