"""Fixtures of the worker's GPU tests: a 1B-shaped model whose outputs mean something, and
sequences to run through it."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def model_1b(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Llama-3.2-1B-shaped model with random weights whose next-token distributions are
    peaked: the output layer maps each token's embedding onto a permuted token (a random
    bigram table) on top of Gaussian noise, so the argmax has a clear winner that attention
    and the MLPs still move around."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    h = cfg.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=g, device="cuda"))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g, device="cuda"))
            elif "lm_head" not in name:
                p.copy_(torch.randn(p.shape, generator=g, device="cuda") / p.shape[1] ** 0.5)
        perm = torch.randperm(cfg.vocab_size, generator=g, device="cuda")
        # scales found on the CPU (HF bf16 against HF fp32): the bigram token wins at about 98% of
        # positions with a median top-1 gap of ~3 logit standard deviations; the rest is noise
        bigram = model.model.embed_tokens.weight[perm] * (30.0 / h)
        model.lm_head.weight.copy_(bigram + torch.randn(bigram.shape, generator=g, device="cuda") * (1.0 / h**0.5))
    path = str(tmp_path_factory.mktemp("llama-1b"))
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    return path


@pytest.fixture(scope="session")
def sequences() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1000, 100_000, (384,), generator=g).tolist() for _ in range(4)]
