"""Structured output on CUDA (decode graphs, the mask applied by xgrammar's Triton kernel):
outputs hold to their formats, and a free request beside them keeps the CPU path's tokens.
GPU only."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from services.worker.build import build_engine
from shared.config import WorkerConfig
from shared.messages import Constraint
from tests import hf_reference
from tests.structured_cases import SCHEMAS
from tests.worker.engine_driver import request, run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_cuda_outputs_hold_and_free_ones_equal_the_cpu_path(tiny_llama: str) -> None:
    tok = hf_reference.tokenizer(tiny_llama)
    reqs = [
        request(f"s{i}", tok("Answer in JSON.")["input_ids"], max_new_tokens=200, constraint=Constraint(
            "json_schema", json.dumps(s)))
        for i, s in enumerate(SCHEMAS)
    ] + [request("free", tok("The weather today")["input_ids"], max_new_tokens=24, ignore_eos=True)]  # fmt: skip
    cuda = build_engine(WorkerConfig(model_dir=tiny_llama, device="cuda", dtype="float32"))
    got = run(cuda, reqs)
    want = run(build_engine(WorkerConfig(model_dir=tiny_llama, device="cpu")), reqs)
    for i, s in enumerate(SCHEMAS):
        out = got[f"s{i}"]
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(tok.decode(out.tokens, skip_special_tokens=True)), s)
    assert got["free"].tokens == want["free"].tokens
    assert cuda.masks is not None and cuda.masks.dev.is_cuda and cuda.masks.host.is_pinned()
