"""Random weights in the dense decoder layout (weights.py), made on the device: for benchmarks at real
shapes where no checkpoint can be downloaded (bench_shapes.py: the shapes). Projections have a standard deviation of
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
