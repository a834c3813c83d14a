"""CLIP's vision transformer as LLaVA reads it: patches and a CLS position embedded, then the
encoder layers up to the hidden state the projector takes (vision_feature_layer); the layers
past it, and the final norm, are never run. Plain PyTorch over a batch of squares; the math of
Hugging Face's CLIPVisionTransformer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from services.worker.models.checkpoint import Checkpoint


@dataclass
class ClipLayer:
    ln1: tuple[torch.Tensor, torch.Tensor]  # weight, bias [h]
    qkv: torch.Tensor  # [3h, h]
    qkv_bias: torch.Tensor  # [3h]
    out: tuple[torch.Tensor, torch.Tensor]  # [h, h], [h]
    ln2: tuple[torch.Tensor, torch.Tensor]
    fc1: tuple[torch.Tensor, torch.Tensor]  # [i, h], [i]
    fc2: tuple[torch.Tensor, torch.Tensor]  # [h, i], [h]


_ACTS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class ClipTower:
    def __init__(self, cfg: dict[str, Any], ckpt: Checkpoint, prefix: str, feature_layer: int) -> None:
        """prefix: where the tower's tensors are ("vision_tower.vision_model." in llava-hf's
        checkpoints); feature_layer: the index into Hugging Face's hidden states (the embeddings,
        then each layer's output) of the one returned."""
        self.heads = int(cfg.get("num_attention_heads", 12))
        self.patch = int(cfg.get("patch_size", 32))
        self.eps = float(cfg.get("layer_norm_eps", 1e-5))
        act = cfg.get("hidden_act", "quick_gelu")
        if act not in _ACTS:
            raise ValueError(f"CLIP hidden_act {act!r} is not supported ({', '.join(_ACTS)})")
        self.act = _ACTS[act]
        layers = int(cfg.get("num_hidden_layers", 12))
        self.depth = feature_layer % (layers + 1)  # layers run: hidden state k is after k layers

        def get(name: str) -> torch.Tensor:
            return ckpt.put(ckpt.get(prefix + name))

        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return get(name + ".weight"), get(name + ".bias")

        self.class_embedding = get("embeddings.class_embedding")  # [h]
        self.patch_embedding = get("embeddings.patch_embedding.weight")  # [h, 3, p, p]
        self.position_embedding = get("embeddings.position_embedding.weight")  # [1 + patches, h]
        self.pre_norm = pair("pre_layrnorm")
        self.layers = []
        for i in range(self.depth):
            p = f"encoder.layers.{i}."
            qkv = [pair(p + f"self_attn.{n}_proj") for n in "qkv"]
            self.layers.append(
                ClipLayer(
                    ln1=pair(p + "layer_norm1"),
                    qkv=torch.cat([w for w, _ in qkv]),
                    qkv_bias=torch.cat([b for _, b in qkv]),
                    out=pair(p + "self_attn.out_proj"),
                    ln2=pair(p + "layer_norm2"),
                    fc1=pair(p + "mlp.fc1"),
                    fc2=pair(p + "mlp.fc2"),
                )
            )

    @torch.inference_mode()
    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, 3, S, S] (normalised) -> the feature layer's hidden states [B, 1 + patches, h],
        the CLS position first."""
        b = pixels.shape[0]
        x = F.conv2d(pixels.to(self.patch_embedding.dtype), self.patch_embedding, stride=self.patch)  # [B, h, g, g]
        x = x.flatten(2).transpose(1, 2)  # [B, g*g, h]
        cls = self.class_embedding.expand(b, 1, -1)
        x = torch.cat([cls, x], dim=1) + self.position_embedding[: x.shape[1] + 1]
        x = F.layer_norm(x, x.shape[-1:], *self.pre_norm, self.eps)
        for layer in self.layers:
            x = x + self._attention(layer, F.layer_norm(x, x.shape[-1:], *layer.ln1, self.eps))
            h = F.layer_norm(x, x.shape[-1:], *layer.ln2, self.eps)
            x = x + F.linear(self.act(F.linear(h, *layer.fc1)), *layer.fc2)
        return x

    def _attention(self, layer: ClipLayer, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        d = h // self.heads
        qkv = F.linear(x, layer.qkv, layer.qkv_bias).view(b, n, 3, self.heads, d)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, heads, n, d]
        o = F.scaled_dot_product_attention(q, k, v)  # bidirectional: every patch sees every other
        return F.linear(o.transpose(1, 2).reshape(b, n, h), *layer.out)
