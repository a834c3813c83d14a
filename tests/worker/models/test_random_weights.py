"""Random weights for benchmarks: a tensor-parallel rank gets the shard shapes the loader
would give it from a checkpoint, the replicated weights agree across ranks, and the
single-rank model is unchanged by the sharding support."""

from __future__ import annotations

from dataclasses import fields, is_dataclass

import pytest
import torch

from services.worker.models.registry import load_weights, random_weights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


def _shapes(w) -> list[tuple]:
    out = [tuple(w.embed.shape), tuple(w.lm_head.shape), tuple(w.final_norm.shape), w.vocab_start]
    for layer in w.layers:  # every field, a family's own too (qwen3's head norms, the experts)
        out += _fields(layer)
    return out


def _fields(obj) -> list[tuple]:
    out = []
    for f in fields(obj):
        t = getattr(obj, f.name)
        out += _fields(t) if is_dataclass(t) else [(f.name, tuple(t.shape) if t is not None else None)]
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"])
@pytest.mark.parametrize("size", [1, 2])
def test_a_ranks_random_shard_has_the_loaded_shards_shapes(tiny_models: dict[str, str], arch: str, size: int) -> None:
    cfg = ModelConfig.from_dir(tiny_models[arch])
    for rank in range(size):
        tp = TensorParallel(rank=rank, size=size)
        loaded = load_weights(tiny_models[arch], cfg, torch.float32, "cpu", tp, progress=False)
        drawn = random_weights(cfg, torch.float32, torch.device("cpu"), seed=0, tp=tp)
        assert _shapes(drawn) == _shapes(loaded)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("size", [1, 2])
def test_a_ranks_random_experts_have_the_loaded_shapes(tiny_moe_models: dict[str, str], arch: str, size: int) -> None:
    cfg = ModelConfig.from_dir(tiny_moe_models[arch])
    for rank in range(size):
        tp = TensorParallel(rank=rank, size=size)
        loaded = load_weights(tiny_moe_models[arch], cfg, torch.float32, "cpu", tp, progress=False)
        drawn = random_weights(cfg, torch.float32, torch.device("cpu"), seed=0, tp=tp)
        assert _shapes(drawn) == _shapes(loaded)
        routers = [layer.experts.router for layer in drawn.layers]
        again = random_weights(cfg, torch.float32, torch.device("cpu"), seed=0, tp=TensorParallel(0, size))
        assert all(torch.equal(r, layer.experts.router) for r, layer in zip(routers, again.layers, strict=True))


def test_ranks_share_the_replicated_weights_and_differ_in_their_shards(tiny_llama: str) -> None:
    cfg = ModelConfig.from_dir(tiny_llama)
    a, b = (random_weights(cfg, torch.float32, torch.device("cpu"), tp=TensorParallel(r, 2)) for r in range(2))
    assert torch.equal(a.final_norm, b.final_norm)
    assert torch.equal(a.layers[-1].mlp_norm, b.layers[-1].mlp_norm)
    assert not torch.equal(a.layers[0].qkv, b.layers[0].qkv)
    single = random_weights(cfg, torch.float32, torch.device("cpu"), seed=0)
    again = random_weights(cfg, torch.float32, torch.device("cpu"), seed=0, tp=TensorParallel())
    assert torch.equal(single.layers[0].down, again.layers[0].down) and torch.equal(single.lm_head, again.lm_head)


def test_a_model_that_does_not_split_is_refused(tiny_llama: str) -> None:
    cfg = ModelConfig.from_dir(tiny_llama)
    with pytest.raises(ValueError, match="split over 3 ranks"):
        random_weights(cfg, torch.float32, torch.device("cpu"), tp=TensorParallel(0, 3))
