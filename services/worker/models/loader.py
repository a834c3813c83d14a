"""Load a Hugging Face model directory's safetensors into LightStream's layout.

q, k and v are concatenated into one projection and gate and up into another, so each
becomes one matmul; under tensor parallelism each rank takes its share first (q, k, v,
gate, up by output rows; o and down by input columns; embedding and output layer by
vocabulary rows).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from tqdm import tqdm

from services.worker.models.llama import LayerWeights, ModelWeights
from services.worker.parallel import TensorParallel
from shared.model_config import ModelConfig


class WeightLoadError(RuntimeError):
    pass


def weight_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, n) for n in names]
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return [single]
    found = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not found:
        raise WeightLoadError(f"no .safetensors files in {model_dir}")
    return [os.path.join(model_dir, f) for f in found]


class _Source:
    """Tensor name -> tensor across all files of a checkpoint, read lazily."""

    def __init__(self, files: list[str]) -> None:
        self.handles = [safe_open(f, framework="pt", device="cpu") for f in files]
        self.where = {name: h for h in self.handles for name in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)

    def get(self, name: str) -> torch.Tensor:
        handle = self.where.get(name)
        if handle is None:
            raise WeightLoadError(f"tensor {name} missing from the checkpoint")
        return handle.get_tensor(name)

    def has(self, name: str) -> bool:
        return name in self.where


def _rows(t: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    if tp.size == 1:
        return t
    if t.shape[0] % tp.size:
        raise WeightLoadError(f"dimension {t.shape[0]} does not split over {tp.size} ranks")
    return t.chunk(tp.size, dim=0)[tp.rank]


def _cols(t: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    if tp.size == 1:
        return t
    if t.shape[1] % tp.size:
        raise WeightLoadError(f"dimension {t.shape[1]} does not split over {tp.size} ranks")
    return t.chunk(tp.size, dim=1)[tp.rank]


def _vocab_shard(t: torch.Tensor, tp: TensorParallel) -> tuple[torch.Tensor, int]:
    """Rows of this rank's vocabulary shard, padding the vocabulary to a multiple of tp."""
    if tp.size == 1:
        return t, 0
    per_rank = -(-t.shape[0] // tp.size)
    padded = torch.zeros(per_rank * tp.size, t.shape[1], dtype=t.dtype)
    padded[: t.shape[0]] = t
    return padded[tp.rank * per_rank : (tp.rank + 1) * per_rank], tp.rank * per_rank


def load_weights(
    model_dir: str,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    tp: TensorParallel,
    progress: bool = True,
) -> ModelWeights:
    src = _Source(weight_files(model_dir))

    def put(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype).contiguous()

    layers = []
    # on a terminal only (disable=None): a log file or a container's log keeps one line per event
    bar = tqdm(range(cfg.num_layers), desc="loading weights", unit="layer", disable=None if progress else True)
    for i in bar:
        p = f"model.layers.{i}."
        q, k, v = (_rows(src.get(p + f"self_attn.{n}_proj.weight"), tp) for n in "qkv")
        bias = None
        if cfg.qkv_bias:
            bias = put(torch.cat([_rows(src.get(p + f"self_attn.{n}_proj.bias"), tp) for n in "qkv"]))
        gate = _rows(src.get(p + "mlp.gate_proj.weight"), tp)
        up = _rows(src.get(p + "mlp.up_proj.weight"), tp)
        layers.append(
            LayerWeights(
                attn_norm=put(src.get(p + "input_layernorm.weight")),
                qkv=put(torch.cat([q, k, v])),
                qkv_bias=bias,
                o=put(_cols(src.get(p + "self_attn.o_proj.weight"), tp)),
                mlp_norm=put(src.get(p + "post_attention_layernorm.weight")),
                gate_up=put(torch.cat([gate, up])),
                down=put(_cols(src.get(p + "mlp.down_proj.weight"), tp)),
            )
        )
    embed, vocab_start = _vocab_shard(src.get("model.embed_tokens.weight"), tp)
    embed = put(embed)
    if cfg.tie_word_embeddings or not src.has("lm_head.weight"):
        lm_head = embed
    else:
        lm_head = put(_vocab_shard(src.get("lm_head.weight"), tp)[0])
    return ModelWeights(
        embed=embed,
        layers=layers,
        final_norm=put(src.get("model.norm.weight")),
        lm_head=lm_head,
        vocab_start=vocab_start,
    )
