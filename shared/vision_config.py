"""What a vision-language model directory says about its images, read without torch so the
front end (how many tokens an image becomes), the visual service (its tower and projector) and
the worker (where embeddings go) agree.

A family is one entry of VISION_ARCHITECTURES; its config.json nests the vision tower under
``vision_config`` and the language model under ``text_config`` (LLaVA's, read by
shared/model_config.py as a Llama or Mistral; Qwen2-VL's, whose released configs keep it at the
top level, as the qwen2_vl family's); ``preprocessor_config.json`` says how an image is resized
and how many tokens it expands to.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

# architecture -> vision family (services/visual/families/, services/tokenizer/images/families.py)
VISION_ARCHITECTURES = {
    "LlavaForConditionalGeneration": "llava",
    "LlavaNextForConditionalGeneration": "llava_next",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
}
QWEN_VL = ("qwen2_vl", "qwen2_5_vl")  # a tower of their own (services/visual/models/) and M-RoPE
SELECT_STRATEGIES = ("default", "full")  # drop the CLS feature, or keep it


class VisionConfigError(ValueError):
    pass


@dataclass(frozen=True)
class VisionConfig:
    family: str  # llava | llava_next | qwen2_vl | qwen2_5_vl
    image_token_id: int  # the placeholder id the prompt's image positions carry
    tower: dict[str, Any]  # config.json's vision_config as written
    projector_act: str = "gelu"  # LLaVA: the projector's activation between its two layers
    feature_layer: int = -2  # LLaVA: which hidden state of the tower the projector reads (-2: the one before last)
    select_strategy: str = "default"  # LLaVA: default drops the CLS position; full keeps it
    processor: dict[str, Any] = field(default_factory=dict)  # preprocessor_config.json
    grid_pinpoints: tuple[tuple[int, int], ...] = ()  # LLaVA-NeXT's tilings, (height, width) each

    def __post_init__(self) -> None:
        if self.select_strategy not in SELECT_STRATEGIES:
            raise VisionConfigError(
                f"vision_feature_select_strategy {self.select_strategy!r} is not supported ({SELECT_STRATEGIES})"
            )
        llava = self.family in ("llava", "llava_next")
        if llava and self.tower.get("model_type", "clip_vision_model") != "clip_vision_model":
            raise VisionConfigError(
                f"LLaVA's vision tower {self.tower.get('model_type')!r} is not supported (CLIP only)"
            )

    @property
    def merge_size(self) -> int:
        """Qwen2-VL: the side of the square of patches one language-model token merges."""
        return int(self.tower.get("spatial_merge_size", 2))

    @property
    def image_size(self) -> int:
        return int(self.tower.get("image_size", 224))

    @property
    def patch_size(self) -> int:
        return int(self.tower.get("patch_size", 32))

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        """The projector's outputs for one image_size square: one per patch (and CLS if kept)."""
        return self.patches_per_side**2 + (1 if self.select_strategy == "full" else 0)

    @classmethod
    def from_dir(cls, model_dir: str, raw: dict[str, Any]) -> VisionConfig | None:
        """None for a text-only model; the processor's files are read from model_dir."""
        archs = raw.get("architectures") or []
        family = next((VISION_ARCHITECTURES[a] for a in archs if a in VISION_ARCHITECTURES), None)
        if family is None:
            return None
        return cls.from_dict(raw, _read(model_dir, "preprocessor_config.json"))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], processor: dict[str, Any]) -> VisionConfig:
        archs = raw.get("architectures") or []
        family = next(VISION_ARCHITECTURES[a] for a in archs if a in VISION_ARCHITECTURES)
        if family in QWEN_VL:
            if raw.get("image_token_id") is None:
                raise VisionConfigError("config.json gives no image_token_id")
            tower = dict(raw.get("vision_config") or {})
            return cls(family=family, image_token_id=int(raw["image_token_id"]), tower=tower, processor=processor)
        layer = raw.get("vision_feature_layer", -2)
        if not isinstance(layer, int):
            raise VisionConfigError(f"vision_feature_layer {layer!r}: only one layer is supported")
        token_id = raw.get("image_token_index", raw.get("image_token_id"))
        if token_id is None:
            raise VisionConfigError("config.json gives no image_token_index")
        pinpoints = tuple((int(h), int(w)) for h, w in raw.get("image_grid_pinpoints") or [])
        if family == "llava_next" and not pinpoints:
            raise VisionConfigError("LLaVA-NeXT's config.json gives no image_grid_pinpoints")
        if family == "llava_next" and raw.get("vision_feature_select_strategy", "default") != "default":
            raise VisionConfigError("LLaVA-NeXT with vision_feature_select_strategy full is not supported")
        return cls(
            family=family,
            image_token_id=int(token_id),
            tower=dict(raw.get("vision_config") or {}),
            projector_act=str(raw.get("projector_hidden_act", "gelu")),
            feature_layer=layer,
            select_strategy=str(raw.get("vision_feature_select_strategy", "default")),
            processor=processor,
            grid_pinpoints=pinpoints,
        )


# Hugging Face's defaults for what a vision model's text_config may leave out (llava-hf's configs give
# only what differs from LlamaConfig's or MistralConfig's defaults)
_TEXT_DEFAULTS = {
    "llama": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
              "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "mistral": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32,
                "rms_norm_eps": 1e-6, "sliding_window": 4096},
}  # fmt: skip


def text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A vision-language config.json's language model (text_config) as a text model's config.json:
    its architecture named, Hugging Face's defaults filled in, the top level's ids (and a
    quantization_config) carried down.
    Qwen2-VL's keeps its architecture, which names its language model's family (qwen2_vl), and its
    text fields at the top level (Qwen's released configs) or under text_config (transformers 5's)."""
    archs = [a for a in raw.get("architectures") or [] if a in VISION_ARCHITECTURES]
    if archs and VISION_ARCHITECTURES[archs[0]] in QWEN_VL:
        return {**raw, **(raw.get("text_config") or {}), "architectures": archs}
    text = dict(raw.get("text_config") or {})
    kind = text.get("model_type", "llama")
    if kind not in _TEXT_DEFAULTS:
        raise VisionConfigError(f"{archs[0]} over a {kind!r} language model is not supported (llama, mistral)")
    for name, value in _TEXT_DEFAULTS[kind].items():
        text.setdefault(name, value)
    text["architectures"] = [{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}[kind]]
    # a quantized checkpoint's quantization_config stands at the top level (it covers the
    # language model's projections; the quantizers leave the tower unquantized)
    for name in ("tie_word_embeddings", "eos_token_id", "bos_token_id", "torch_dtype", "dtype", "quantization_config"):
        if name in raw and name not in text:
            text[name] = raw[name]
    return text


def _read(model_dir: str, name: str) -> dict[str, Any]:
    path = os.path.join(model_dir, name)
    if not os.path.exists(path):
        raise VisionConfigError(f"{path} not found: a vision model needs its image processor's config")
    with open(path) as f:
        return json.load(f)


def image_pseudo_id(image_hash: str) -> int:
    """The id an image's prompt positions carry (GenerateReq.images): below -1, so real ids and the
    worker's PLACEHOLDER (-1) stay apart; the same for the same image and different for different
    ones, so the prompt cache and the router's prefix index, which key on ids, never match one
    image's KV to another's."""
    return -2 - int(image_hash[:15], 16)
