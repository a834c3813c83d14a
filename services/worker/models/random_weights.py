"""Random weights in the dense decoder layout (weights.py), made on the device: for benchmarks at real
shapes where no checkpoint can be downloaded. Projections have a standard deviation of
1/sqrt(fan_in) so activations stay of order one through every layer."""

from __future__ import annotations

import torch

from services.worker.models.weights import LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


def dense_random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """The whole model, or with tp of several ranks this rank's shard of one: the shapes
    a checkpoint's loader gives it (q, k, v, gate and up by output rows; o and down by input columns;
    the vocabulary in equal padded parts). Weights every rank holds whole (the norms) come
    from the same seed on every rank; each rank draws its shards from a seed of its own."""
    tp = tp or TensorParallel()
    if cfg.num_kv_heads % tp.size or cfg.num_heads % tp.size or cfg.intermediate_size % tp.size:
        raise ValueError(
            f"{cfg.num_heads} heads, {cfg.num_kv_heads} KV heads and {cfg.intermediate_size} "
            f"MLP columns must all split over {tp.size} ranks"
        )
    whole = torch.Generator(device=device).manual_seed(seed)
    own = whole if tp.size == 1 else torch.Generator(device=device).manual_seed(seed + 1000 * (tp.rank + 1))
    h, d, n = cfg.hidden_size, cfg.head_dim, tp.size
    qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * d // n
    inter = cfg.intermediate_size // n
    vocab = -(-cfg.vocab_size // n)

    def normal(*shape: int, std: float, g: torch.Generator = own) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

    def norm() -> torch.Tensor:
        return 1.0 + normal(h, std=0.05, g=whole)

    layers = [
        LayerWeights(
            attn_norm=norm(),
            qkv=normal(qkv_rows, h, std=h**-0.5),
            qkv_bias=normal(qkv_rows, std=0.02) if cfg.qkv_bias else None,
            # the standard deviations are the whole matrix's: a shard is part of one
            o=normal(h, cfg.num_heads * d // n, std=(cfg.num_heads * d) ** -0.5),
            mlp_norm=norm(),
            gate_up=normal(2 * inter, h, std=h**-0.5),
            down=normal(h, inter, std=cfg.intermediate_size**-0.5),
        )
        for _ in range(cfg.num_layers)
    ]
    embed = normal(vocab, h, std=1.0)
    lm_head = embed if cfg.tie_word_embeddings else normal(vocab, h, std=4.0 * h**-0.5)
    return ModelWeights(
        embed=embed, layers=layers, final_norm=norm(), lm_head=lm_head, vocab_start=tp.rank * vocab if n > 1 else 0
    )


# the shapes benchmarks use (config.json fields, as a Hugging Face directory would give them)
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "torch_dtype": "bfloat16",
}
LLAMA_1B = {**LLAMA3_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16}
GEMMA2_9B = {  # google/gemma-2-9b's
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "vocab_size": 256000,
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_hidden_layers": 42,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 8192,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
GEMMA3_12B = {  # google/gemma-3-12b-it's text model
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 262208,
    "hidden_size": 3840,
    "intermediate_size": 15360,
    "num_hidden_layers": 48,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "rms_norm_eps": 1e-6,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
SHAPES = {"llama3-8b": LLAMA3_8B, "llama-1b": LLAMA_1B, "gemma2-9b": GEMMA2_9B, "gemma3-12b": GEMMA3_12B}
