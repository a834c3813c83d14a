"""Random weights in the dense decoder layout (weights.py), made on the device: for benchmarks at real
shapes where no checkpoint can be downloaded. Projections have a standard deviation of
1/sqrt(fan_in) so activations stay of order one through every layer."""

from __future__ import annotations

from collections.abc import Callable

import torch

from services.worker.models.weights import LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


def dense_random_weights(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    tp: TensorParallel | None = None,
    dense_mlp: Callable[[int], bool] = lambda layer: True,
) -> ModelWeights:
    """The whole model, or with tp of several ranks this rank's shard of one: the shapes
    a checkpoint's loader gives it (q, k, v, gate and up by output rows; o and down by input columns;
    the vocabulary in equal padded parts). Weights every rank holds whole (the norms) come
    from the same seed on every rank; each rank draws its shards from a seed of its own. A layer
    for which dense_mlp is false gets no MLP (a mixture of experts adds its own: models/moe.py)."""
    tp = tp or TensorParallel()
    if cfg.num_kv_heads % tp.size or cfg.num_heads % tp.size or cfg.intermediate_size % tp.size:
        raise ValueError(
            f"{cfg.num_heads} heads, {cfg.num_kv_heads} KV heads and {cfg.intermediate_size} "
            f"MLP columns must all split over {tp.size} ranks"
        )
    draw = Draws(cfg, dtype, device, seed, tp)
    h, d, n = cfg.hidden_size, cfg.head_dim, tp.size
    qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * d // n
    inter = cfg.intermediate_size // n
    vocab = -(-cfg.vocab_size // n)

    def layer(i: int) -> LayerWeights:
        mlp = dense_mlp(i)
        return LayerWeights(
            attn_norm=draw.norm(),
            qkv=draw.normal(qkv_rows, h, std=h**-0.5),
            qkv_bias=draw.normal(qkv_rows, std=0.02) if cfg.qkv_bias else None,
            # the standard deviations are the whole matrix's: a shard is part of one
            o=draw.normal(h, cfg.num_heads * d // n, std=(cfg.num_heads * d) ** -0.5),
            mlp_norm=draw.norm(),
            gate_up=draw.normal(2 * inter, h, std=h**-0.5) if mlp else None,
            down=draw.normal(h, inter, std=cfg.intermediate_size**-0.5) if mlp else None,
        )

    layers = [layer(i) for i in range(cfg.num_layers)]
    embed = draw.normal(vocab, h, std=1.0)
    lm_head = embed if cfg.tie_word_embeddings else draw.normal(vocab, h, std=4.0 * h**-0.5)
    return ModelWeights(
        embed=embed, layers=layers, final_norm=draw.norm(), lm_head=lm_head, vocab_start=tp.rank * vocab if n > 1 else 0
    )


class Draws:
    """Normal draws on the device in the weights' dtype: a rank's shards from a seed of its own,
    weights every rank holds whole (whole=True) from one seed all ranks share."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int, tp: TensorParallel):
        self.hidden = cfg.hidden_size
        self.dtype = dtype
        self.device = device
        self.whole = torch.Generator(device=device).manual_seed(seed)
        self.own = (
            self.whole if tp.size == 1 else torch.Generator(device=device).manual_seed(seed + 1000 * (tp.rank + 1))
        )

    def normal(self, *shape: int, std: float, whole: bool = False) -> torch.Tensor:
        g = self.whole if whole else self.own
        return (torch.randn(*shape, generator=g, device=self.device, dtype=torch.float32) * std).to(self.dtype)

    def norm(self) -> torch.Tensor:
        """An RMSNorm's weight near one: [H]."""
        return 1.0 + self.normal(self.hidden, std=0.05, whole=True)


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
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,  # each expert's
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
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
SHAPES = {
    "llama3-8b": LLAMA3_8B,
    "llama-1b": LLAMA_1B,
    "mixtral-8x7b": MIXTRAL_8X7B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "gemma2-9b": GEMMA2_9B,
    "gemma3-12b": GEMMA3_12B,
}
