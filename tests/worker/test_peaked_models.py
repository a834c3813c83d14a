"""The machinery of the GPU's 1B bf16 tests (tests/worker/peaked_models.py) on the CPU: every
family's 1B shape is 1B-class and keeps its features, and each family's tiny peaked model
through the CPU engine in float32 equals Hugging Face's under teacher forcing, from a prefill
and from decode steps, over sequences longer than the sliding windows."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors import safe_open

from services.worker.build import build_engine
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from tests.worker import peaked_models


@pytest.mark.parametrize("family", sorted(peaked_models.FAMILIES_1B))
def test_1b_shape_is_1b_class_and_keeps_its_features(family: str) -> None:
    cfg = peaked_models.FAMILIES_1B[family]
    n = peaked_models.parameters(cfg)
    assert 1.0e9 <= n <= 2.0e9, f"{family}: {n / 1e9:.2f}B parameters"
    mc = ModelConfig.from_dict(cfg)
    assert mc.family == family
    assert mc.max_position_embeddings >= 384  # the GPU test's sequences
    if family in peaked_models.MOE:
        assert mc.num_experts >= 8 and mc.num_experts_per_tok >= 2
    if family in ("qwen3", "qwen3_moe", "gemma3"):
        assert mc.num_heads * mc.head_dim != mc.hidden_size
    if family.startswith("gemma"):
        assert 0 in mc.layer_windows and 128 in mc.layer_windows  # global layers among sliding ones
        assert mc.final_logit_softcap == (30.0 if family == "gemma2" else 0.0)
    assert mc.qkv_bias == (family in ("qwen2", "qwen2_moe"))


@pytest.fixture(scope="module")
def sequences() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(10, 500, (48,), generator=g).tolist() for _ in range(2)]  # 3 windows of 16


@pytest.mark.parametrize("family", sorted(peaked_models.FAMILIES_1B))
def test_tiny_peaked_model_through_the_engine_equals_hf(family: str, tmp_path, sequences) -> None:
    cfg = peaked_models.tiny(peaked_models.FAMILIES_1B[family])
    path = peaked_models.build(cfg, str(tmp_path), "cpu")
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert ("model.layers.0.self_attn.qkv_proj.weight" in names) == (family == "phi3")  # fused as Phi-3 stores it
    assert ModelConfig.from_dir(path).torch_dtype == "bfloat16"  # as checkpoints are stored
    refs = peaked_models.reference_logits(path, sequences, "cpu")
    logits = torch.cat(refs)
    top2 = logits.topk(2, dim=-1).values
    gap = ((top2[:, 0] - top2[:, 1]) / logits.std(dim=-1)).median().item()
    assert gap > 0.5, f"the reference's top-1 leads by a median {gap:.2f} logit standard deviations only"
    engine = build_engine(WorkerConfig(model_dir=path, device="cpu", dtype="float32", max_total_token_num=1024))
    got = peaked_models.engine_against_reference(engine, refs, sequences, start=32)
    for kind, rows in got.items():
        for rel, agree in rows:
            assert agree == 1.0 and rel < 1e-4, (family, kind, rel, agree)
