"""Random models of every family whose next-token distributions are peaked, written as Hugging
Face directories: the GPU's bf16-against-fp32 tests run them at about 1B parameters, the CPU's at
tiny sizes (the same code, so it cannot rot).

Peaked: the output layer maps each token's input to the residual (its embedding, times Gemma's
sqrt(hidden)) onto a permuted token (a random bigram table) on top of Gaussian noise, so the
argmax has a clear winner that attention and the MLPs still move around. Scales found on the CPU
for the Llama shape (HF bf16 against HF fp32): the bigram token wins at about 98% of positions
with a median top-1 gap of ~3 logit standard deviations; the rest is noise.

Each 1B shape keeps what sets its family apart: Qwen2's QKV bias and few KV heads, Qwen3's head
norms and wide heads, Phi-3's fused qkv and gate_up (in its checkpoint), Gemma's (1 + w) norms,
scaled embedding, GeGLU, soft caps and sliding windows (128 tokens, so the 384-token sequences
cross them) interleaved with global layers, several routed experts with top-k (a shared expert
in Qwen2-MoE). All have Llama 3's 128256-token vocabulary, so the same token ids run through
each, and an untied output layer (the bigram table).
"""

from __future__ import annotations

import json
import os

import torch

from services.worker.engine import Engine
from tests.worker.teacher_forcing import decode_logits, prefill_logits

VOCAB = 128256
_DENSE = {
    "vocab_size": VOCAB,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
_WINDOW = 128
_GEMMA = {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256}
_GEMMA |= {"sliding_window": _WINDOW, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}
FAMILIES_1B: dict[str, dict] = {
    "llama": _DENSE
    | {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
    },
    "mistral": _DENSE | {"model_type": "mistral", "rope_theta": 1000000.0, "sliding_window": None},
    "qwen2": _DENSE
    | {"model_type": "qwen2", "num_attention_heads": 16, "num_key_value_heads": 2, "rope_theta": 1000000.0}
    | {"use_sliding_window": False, "sliding_window": None, "rms_norm_eps": 1e-6},
    "qwen3": _DENSE
    | {"model_type": "qwen3", "intermediate_size": 6144, "head_dim": 128}  # 32 heads: twice hidden wide
    | {"rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None, "rms_norm_eps": 1e-6},
    "phi3": _DENSE | {"model_type": "phi3", "num_key_value_heads": 32, "rope_theta": 10000.0, "sliding_window": None},
    "gemma2": _DENSE
    | _GEMMA
    | {"model_type": "gemma2", "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "rope_theta": 10000.0},
    "gemma3": _DENSE
    | _GEMMA
    | {
        "model_type": "gemma3_text",
        "num_attention_heads": 4,  # Gemma 3 1B's heads: 4 of 256, wider than hidden, one KV head
        "num_key_value_heads": 1,
        "num_hidden_layers": 18,  # five sliding layers of six: layers 5, 11 and 17 attend globally
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    },
    "mixtral": _DENSE
    | {"model_type": "mixtral", "intermediate_size": 1536, "num_hidden_layers": 12, "rope_theta": 1000000.0}
    | {"num_local_experts": 8, "num_experts_per_tok": 2, "router_jitter_noise": 0.0, "sliding_window": None},
    "qwen2_moe": _DENSE
    | {"model_type": "qwen2_moe", "num_attention_heads": 16, "num_key_value_heads": 16, "rope_theta": 1000000.0}
    | {"num_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 512}
    | {"shared_expert_intermediate_size": 2048, "qkv_bias": True, "use_sliding_window": False, "sliding_window": None},
    "qwen3_moe": _DENSE
    | {"model_type": "qwen3_moe", "num_hidden_layers": 12, "num_attention_heads": 32, "num_key_value_heads": 4}
    | {"head_dim": 128, "num_experts": 32, "num_experts_per_tok": 8, "moe_intermediate_size": 384}
    | {"norm_topk_prob": True, "rope_theta": 1000000.0, "use_sliding_window": False, "sliding_window": None},
}
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
UNIT_OFFSET_NORMS = ("gemma2", "gemma3_text")  # RMSNorm times (1 + w)


def tiny(cfg: dict, vocab: int = 512) -> dict:
    """The same family at a size the CPU runs in seconds: every feature kept, a 16-token window."""
    heads = 4
    head_dim = 32 if "head_dim" in cfg else None  # wide heads stay unequal to hidden / heads
    shrunk = {
        "vocab_size": vocab,
        "hidden_size": 64,
        "intermediate_size": 128 if "num_local_experts" not in cfg else 48,
        "num_attention_heads": heads,
        "num_key_value_heads": heads if cfg["num_key_value_heads"] == cfg["num_attention_heads"] else 2,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    if head_dim:
        shrunk["head_dim"] = head_dim
        if "query_pre_attn_scalar" in cfg:
            shrunk["query_pre_attn_scalar"] = head_dim
    if "num_experts" in cfg:
        shrunk |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48}
    if "num_local_experts" in cfg:
        shrunk |= {"num_local_experts": 4}
    if "shared_expert_intermediate_size" in cfg:
        shrunk["shared_expert_intermediate_size"] = 96
    if "layer_types" in cfg:  # Gemma 3: one global layer among three sliding ones
        shrunk |= {"num_hidden_layers": 4, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}
    else:
        shrunk["num_hidden_layers"] = 4 if cfg.get("sliding_window") else 2
    if cfg.get("sliding_window"):
        shrunk["sliding_window"] = 16
    return cfg | shrunk


def build(cfg: dict, path: str, device: str, seed: int = 0) -> str:
    """Write the peaked random model of config.json fields cfg to path (bf16 safetensors, as a
    checkpoint is stored; references load it back in fp32). -> path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(cfg)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        _peak(model, cfg, torch.Generator(device=device).manual_seed(seed), device)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return path


def _peak(model, cfg: dict, g: torch.Generator, device: str) -> None:
    """Every weight drawn: norms near one (Gemma's (1 + w): near zero), projections of standard
    deviation 1/sqrt(fan_in) (the last dimension, an expert's too), biases small, and the output
    layer the bigram table over each token's input to the residual."""
    h = cfg["hidden_size"]
    offset = cfg["model_type"] in UNIT_OFFSET_NORMS
    scale = h**0.5 if offset else 1.0  # Gemma scales the embedding by sqrt(hidden) into the residual

    def randn(shape: torch.Size) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=device)

    for name, p in model.named_parameters():
        if offset and ("post_attention_layernorm" in name or "post_feedforward_layernorm" in name):
            # Gemma's post-norms scale what each half of a layer adds to the residual: by about
            # 0.3, as much as a Llama layer adds unnormed, so the token's own input still shows
            p.copy_(-0.7 + 0.05 * randn(p.shape))
        elif name.endswith("norm.weight"):
            p.copy_((0.0 if offset else 1.0) + 0.05 * randn(p.shape))
        elif "embed_tokens" in name:
            p.copy_(randn(p.shape) / scale)  # the residual starts at unit variance
        elif "lm_head" in name:
            continue
        elif p.dim() == 1:
            p.copy_(0.02 * randn(p.shape))
        else:
            p.copy_(randn(p.shape) / p.shape[-1] ** 0.5)
    perm = torch.randperm(cfg["vocab_size"], generator=g, device=device)
    bigram = model.model.embed_tokens.weight[perm] * (scale * 30.0 / h)
    model.lm_head.weight.copy_(bigram + randn(bigram.shape) * (1.0 / h**0.5))


def parameters(cfg: dict) -> int:
    """Parameters of config.json fields cfg, counted from the model on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(cfg)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def reference_logits(path: str, sequences: list[list[int]], device: str) -> list[torch.Tensor]:
    """Hugging Face's logits in float32 at every position of each sequence, [L, V] each (eager
    attention for Gemma, whose soft cap SDPA lacks)."""
    from transformers import AutoModelForCausalLM

    eager = {"attn_implementation": "eager"} if _model_type(path) in UNIT_OFFSET_NORMS else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **eager).to(device).eval()
    with torch.no_grad():
        out = [model(torch.tensor([s], device=device)).logits[0].float() for s in sequences]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _model_type(path: str) -> str:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)["model_type"]


def compare(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """-> (worst per-position relative L2 error, top-1 agreement) of [L, V] logits."""
    ref = ref.to(got.device)
    rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    return rel, agree


def engine_against_reference(
    engine: Engine, refs: list[torch.Tensor], sequences: list[list[int]], start: int
) -> dict[str, list[tuple[float, float]]]:
    """Each sequence's (worst relative L2 error, top-1 agreement) of the engine's logits against
    refs under teacher forcing: from one prefill step over it, and from decode steps (the
    sequences side by side, one token each) over its positions from start."""
    prefill = [compare(prefill_logits(engine, s), r) for s, r in zip(sequences, refs, strict=True)]
    decode = decode_logits(engine, sequences, start)
    return {
        "prefill": prefill,
        "decode": [compare(got, r[start:]) for got, r in zip(decode, refs, strict=True)],
    }
