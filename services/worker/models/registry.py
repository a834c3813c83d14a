"""Model families by name: what builds each one's model, reads its checkpoint and makes random
weights of its shapes. A new architecture is its own file (copy llama.py), one line here, and a
test; the name config.json gives it is parsed in shared/model_config.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.worker.models import gemma2, gemma3, llama, mixtral, moe, phi3, qwen2_vl, qwen3, qwen_moe
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.random_weights import dense_random_weights
from services.worker.models.weights import ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


@dataclass(frozen=True)
class Family:
    model: type  # (cfg, weights, ops, attn, cos_sin, tp) -> a models.interface.CausalLM
    load: Callable[[Checkpoint, ModelConfig, Shard], ModelWeights]
    random: Callable[[ModelConfig, torch.dtype, torch.device, int, TensorParallel], ModelWeights]


LLAMA = Family(model=llama.LlamaModel, load=llama.load, random=dense_random_weights)
QWEN3 = Family(model=qwen3.Qwen3Model, load=qwen3.load, random=qwen3.random_weights)
PHI3 = Family(model=phi3.Phi3Model, load=phi3.load, random=dense_random_weights)
GEMMA2 = Family(model=gemma2.Gemma2Model, load=gemma2.load, random=gemma2.random_weights)
GEMMA3 = Family(model=gemma3.Gemma3Model, load=gemma3.load, random=gemma3.random_weights)
MIXTRAL = Family(model=mixtral.MixtralModel, load=mixtral.load, random=moe.random_weights)
QWEN2_MOE = Family(model=qwen_moe.Qwen2MoeModel, load=qwen_moe.load, random=moe.random_weights)
QWEN2_VL = Family(model=qwen2_vl.Qwen2VLModel, load=llama.load, random=dense_random_weights)
QWEN3_MOE = Family(model=qwen_moe.Qwen3MoeModel, load=qwen_moe.load, random=qwen_moe.qwen3_random_weights)

# ModelConfig.family -> its implementation
FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "qwen3": QWEN3,
    "phi3": PHI3,
    "mixtral": MIXTRAL,
    "qwen2_moe": QWEN2_MOE,
    "qwen3_moe": QWEN3_MOE,
    "gemma2": GEMMA2,
    "gemma3": GEMMA3,
    "qwen2_vl": QWEN2_VL,  # the language model; the vision tower is services/visual's
    "qwen2_5_vl": QWEN2_VL,
}


def family_of(cfg: ModelConfig) -> Family:
    try:
        return FAMILIES[cfg.family]
    except KeyError:
        raise ValueError(f"no model code for family {cfg.family!r}; known: {sorted(FAMILIES)}") from None


def load_weights(
    model_dir: str,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    tp: TensorParallel,
    progress: bool = True,
) -> ModelWeights:
    """The checkpoint in model_dir, this rank's shard of it, on device in dtype (a vision-language
    model's: its language model's)."""
    ckpt = Checkpoint(model_dir, dtype, device, progress, cfg.quantization)
    if cfg.vision is not None:
        ckpt.set_text_model()
    return family_of(cfg).load(ckpt, cfg, Shard(tp))


def random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """Random weights of the family's shapes (benchmarks at real shapes, where nothing can be downloaded)."""
    return family_of(cfg).random(cfg, dtype, device, seed, tp or TensorParallel())
