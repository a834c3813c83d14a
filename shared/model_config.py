"""What a Hugging Face model directory's config.json says, for the families the worker runs.

Parsed without torch so the front end and the worker agree on the context length and
the end-of-sequence ids. Both spellings of rotary scaling are read: the classic
``rope_theta`` + ``rope_scaling`` and transformers 5's ``rope_parameters``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from shared.quant_config import WeightQuant, parse_quantization
from shared.vision_config import VisionConfig, text_config

log = logging.getLogger(__name__)

# architectures -> family name used by the worker's model code
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    # the language model of a vision-language model (its vision tower is services/visual's)
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
}
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe")
QWEN_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
# model type -> family name, for a config.json without architectures: the family's own name, or
# (Gemma 3's text model) another
MODEL_TYPE_FAMILIES = {n: n for n in SUPPORTED_ARCHITECTURES.values()} | {"gemma3_text": "gemma3"}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")


class ModelConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    family: str  # llama | mistral | qwen2 | qwen3 | phi3 | mixtral | qwen2_moe | qwen3_moe | gemma2 | gemma3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    torch_dtype: str  # as config.json names it: bfloat16, float16, float32
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # {} when none
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # a mixture of experts (num_experts 0: a dense model)
    num_experts: int = 0  # routed experts in each sparse layer
    num_experts_per_tok: int = 0  # how many of them each token is routed to (top-k)
    moe_intermediate_size: int = 0  # each routed expert's MLP width
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert beside the routed ones; 0: none
    norm_topk_prob: bool = False  # the top-k routing weights renormalised to sum to one
    dense_layers: tuple[int, ...] = ()  # layers whose MLP is dense (intermediate_size) among sparse ones
    # each layer's sliding window: a query at position p sees keys in (p - w, p]; 0 for a layer
    # that sees every earlier position (and no tuple at all where every layer does)
    layer_windows: tuple[int, ...] = ()
    attn_logit_softcap: float = 0.0  # attention scores s -> c * tanh(s / c) before the softmax; 0: none
    final_logit_softcap: float = 0.0  # the same on the logits; 0: none
    query_pre_attn_scalar: float = 0.0  # the attention scale is its -1/2 power; 0: head_dim's
    local_rope_theta: float = 0.0  # the sliding-window layers' own rotary base (Gemma 3); 0: rope_theta's
    quantization: WeightQuant | None = None  # the checkpoint's int4 weights (shared/quant_config.py); None: none
    mrope_section: tuple[int, ...] = ()  # M-RoPE: the rotary frequencies t, h and w positions turn; (): none
    vision: VisionConfig | None = None  # a vision-language model's images (shared/vision_config.py); None: text only

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_attention_heads {self.num_heads} is not a multiple of num_key_value_heads {self.num_kv_heads}"
            )
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ModelConfigError(f"rope scaling type {rope_type!r} is not supported ({SUPPORTED_ROPE_TYPES})")
        if rope_type == "longrope":
            for name in ("short_factor", "long_factor"):
                factors = self.rope_scaling.get(name)
                if not isinstance(factors, list) or len(factors) != self.head_dim // 2:
                    raise ModelConfigError(
                        f"longrope's {name} must list one factor per rotary frequency ({self.head_dim // 2})"
                    )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ModelConfigError(
                f"num_experts_per_tok {self.num_experts_per_tok} must be between 1 and the {self.num_experts} experts"
            )
        if self.mrope_section and sum(self.mrope_section) != self.head_dim // 2:
            raise ModelConfigError(f"mrope_section {list(self.mrope_section)} does not sum to half the head_dim")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ModelConfigError(f"{len(self.layer_windows)} layer windows for {self.num_layers} layers")
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise ModelConfigError(f"the experts' intermediate size {self.moe_intermediate_size} must be positive")

    def sparse(self, layer: int) -> bool:
        """Whether layer's MLP is routed experts (else Llama's dense MLP)."""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def context_length(self) -> int:
        return self.max_position_embeddings

    @property
    def attention_scale(self) -> float:
        """What q . k is multiplied by before the softmax."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @classmethod
    def from_dir(cls, model_dir: str) -> ModelConfig:
        path = os.path.join(model_dir, "config.json")
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError as e:
            raise ModelConfigError(f"{path} not found: is {model_dir!r} a Hugging Face model directory?") from e
        gen_path = os.path.join(model_dir, "generation_config.json")
        gen = {}
        if os.path.exists(gen_path):
            with open(gen_path) as f:
                gen = json.load(f)
        vision = VisionConfig.from_dir(model_dir, raw)
        if vision is None:
            return cls.from_dict(raw, gen)
        return dataclasses.replace(cls.from_dict(text_config(raw), gen), vision=vision)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        archs = raw.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if family is None:
            family = MODEL_TYPE_FAMILIES.get(raw.get("model_type", ""))
        if family is None:
            raise ModelConfigError(
                f"architecture {archs or raw.get('model_type')!r} is not supported; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        if family == "qwen3":
            _refuse_sliding_window(raw)
        moe = _moe_fields(family, raw)
        raw, gemma = _gemma(raw, family)  # Hugging Face's Gemma defaults filled in, and Gemma's own fields
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        theta, scaling, mrope_section = _rope(raw)
        max_pos = int(raw.get("max_position_embeddings", 2048))
        if scaling.get("rope_type") == "longrope":
            max_pos = _longrope(raw, scaling, max_pos)
        window = raw.get("sliding_window")
        # Phi-3's attention takes its window whenever config.json gives one (no use_sliding_window)
        slides = family in ("mistral", "phi3", "mixtral") or raw.get("use_sliding_window")
        if window and slides and int(window) < max_pos:
            log.warning("sliding window %s < context %s: serving contexts up to the window only", window, max_pos)
            max_pos = int(window)
        eos = _ids((generation or {}).get("eos_token_id")) or _ids(raw.get("eos_token_id"))
        return cls(
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=_qkv_bias(family, raw),
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            rope_scaling=scaling,
            eos_token_ids=eos,
            bos_token_id=raw.get("bos_token_id"),
            quantization=parse_quantization(raw),
            mrope_section=mrope_section,
            **moe,
            **gemma,
        )


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any], tuple[int, ...]]:
    """-> (theta, scaling or {}, M-RoPE's sections or ()) from rope_theta + rope_scaling or rope_parameters."""
    rope_params = dict(raw.get("rope_parameters") or {})
    rope_scaling = dict(raw.get("rope_scaling") or {})
    theta = raw.get("rope_theta", rope_params.pop("rope_theta", 10000.0))
    rope_params.pop("rope_theta", None)
    scaling = rope_scaling or rope_params
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling.get("rope_type") == "su":  # LongRoPE's name in the first Phi-3 configs
        scaling["rope_type"] = "longrope"
    mrope_section = tuple(int(n) for n in scaling.pop("mrope_section", ()))
    if scaling.get("rope_type") == "mrope":  # M-RoPE's frequencies are the default ones
        scaling["rope_type"] = "default"
    if scaling.get("rope_type", "default") == "default":
        scaling = {}
    _refuse_partial_rotary(raw, rope_params, scaling)
    return float(theta), scaling, mrope_section


def _qkv_bias(family: str, raw: dict[str, Any]) -> bool:
    if family in ("qwen2", *QWEN_VL_FAMILIES):
        return True
    if family == "qwen2_moe":  # transformers' default, and what Qwen1.5-MoE's config.json leaves out
        return bool(raw.get("qkv_bias", True))
    # Phi-3's projections have no bias whatever attention_bias says
    return family != "phi3" and bool(raw.get("attention_bias", False))


# transformers' defaults for what a mixture-of-experts config.json leaves out, by family:
# (experts, experts per token, each expert's width or None for intermediate_size)
_MOE_DEFAULTS = {"mixtral": (8, 2, None), "qwen2_moe": (60, 4, 1408), "qwen3_moe": (128, 8, 768)}


def _moe_fields(family: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A mixture of experts' fields as transformers reads them; {} for a dense family. Mixtral's
    experts are intermediate_size wide and always renormalise their top-k weights; the Qwen
    families renormalise as norm_topk_prob says (default false), and make a layer dense where
    mlp_only_layers names it or decoder_sparse_step skips it."""
    if family not in MOE_FAMILIES:
        return {}
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelConfigError(f"hidden_act {raw['hidden_act']!r} is not supported: the experts' kernel applies SiLU")
    if family == "qwen3_moe" and raw.get("attention_bias"):
        raise ModelConfigError("Qwen3-MoE with attention_bias (an o_proj bias too) is not supported")
    experts, top_k, width = _MOE_DEFAULTS[family]
    layers = int(raw["num_hidden_layers"])
    given = next((raw[n] for n in ("num_local_experts", "num_experts") if raw.get(n) is not None), experts)
    out: dict[str, Any] = {
        "num_experts": int(given),
        "num_experts_per_tok": int(raw.get("num_experts_per_tok", top_k)),
        "moe_intermediate_size": int(raw.get("moe_intermediate_size", width or raw["intermediate_size"])),
        "norm_topk_prob": family == "mixtral" or bool(raw.get("norm_topk_prob", False)),
    }
    if family == "mixtral":
        return out
    step = int(raw.get("decoder_sparse_step") or 1)
    only = set(raw.get("mlp_only_layers") or [])
    out["dense_layers"] = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    if family == "qwen2_moe":
        out["shared_expert_intermediate_size"] = int(raw.get("shared_expert_intermediate_size", 5632))
        if out["shared_expert_intermediate_size"] <= 0:
            raise ModelConfigError("Qwen2-MoE without a shared expert (shared_expert_intermediate_size 0)")
    return out


def _refuse_sliding_window(raw: dict[str, Any]) -> None:
    """Qwen3 turns a sliding window on with use_sliding_window (on the layers from
    max_window_layers) or names it per layer in layer_types; this parser does not turn those
    into layer_windows (which the attention backends take, as Gemma's are), so a config that
    does either, or names a layer type not known here, is refused."""
    types = set(raw.get("layer_types") or ["full_attention"])
    if raw.get("use_sliding_window") or types != {"full_attention"}:
        raise ModelConfigError(
            f"Qwen3 with a sliding window or other layer types (use_sliding_window "
            f"{raw.get('use_sliding_window')!r}, layer types {sorted(types)}) is not supported: "
            "Qwen3 is served with full attention only"
        )


def _refuse_partial_rotary(raw: dict[str, Any], rope_params: dict[str, Any], scaling: dict[str, Any]) -> None:
    """Rotary over part of each head (partial_rotary_factor < 1, e.g. Phi-4-mini's 0.75) is not
    what the rotary kernels do: they rotate the whole head."""
    for where in (raw, rope_params, scaling):
        factor = where.get("partial_rotary_factor")
        if factor is not None and float(factor) != 1.0:
            raise ModelConfigError(
                f"partial_rotary_factor {factor} is not supported: the rotary kernels rotate whole heads"
            )


def _longrope(raw: dict[str, Any], scaling: dict[str, Any], max_pos: int) -> int:
    """LongRoPE's fields resolved as Hugging Face resolves them, into scaling (the original
    context: config.json's top-level field first, as Phi-3 writes it; factor, where config.json
    gives none: the extended context over the original), and the context served: at most the
    original. Hugging Face switches from the short factors to the long ones once a sequence
    outgrows the original context, rotating every cached key again; a rotary table fixed per
    position cannot, so only the short factors' contexts are served (models/layers/rope.py)."""
    original = raw.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
    if not original:
        raise ModelConfigError("longrope scaling without original_max_position_embeddings")
    original = int(original)
    scaling["original_max_position_embeddings"] = original
    if scaling.get("factor") is None:
        scaling["factor"] = max_pos / original
    if max_pos > original:
        log.warning(
            "longrope: serving contexts up to original_max_position_embeddings %s, not %s (the short factors; "
            "the long ones apply to whole sequences beyond it, which a fixed rotary table cannot follow)",
            original,
            max_pos,
        )
    return min(max_pos, original)


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


# Hugging Face's Gemma2Config / Gemma3TextConfig defaults for what config.json may leave out
_GEMMA_DEFAULTS = {
    "gemma2": {"head_dim": 256, "max_position_embeddings": 8192, "rope_theta": 10000.0, "tie_word_embeddings": True},
    "gemma3": {"head_dim": 256, "max_position_embeddings": 131072, "tie_word_embeddings": True},
}
_GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_python_tanh")  # GELU's tanh approximation, as the kernels do


def _gemma(raw: dict[str, Any], family: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """For Gemma 2 and 3: (config.json with Hugging Face's defaults for the fields the other families
    share, Gemma's own ModelConfig fields); (raw, {}) for the other families. Gemma 2: attention
    and final logit soft caps (50, 30 by default), the window on even layers; Gemma 3: no attention
    soft cap (Hugging Face's Gemma 3 attention applies none whatever config.json says), the window on
    five layers of six, the sliding layers' own rotary base. The context is not capped by the window:
    the full-attention layers see every position."""
    if family not in _GEMMA_DEFAULTS:
        return raw, {}
    if "text_config" in raw:  # Gemma3ForConditionalGeneration: model_type gemma3, the text model nested
        raise ModelConfigError(
            "multimodal Gemma 3 (Gemma3ForConditionalGeneration) is not supported: its text model sits under "
            "text_config and its weights under language_model; serve a text-only Gemma3ForCausalLM checkpoint"
        )
    if raw.get("use_bidirectional_attention"):
        raise ModelConfigError("Gemma with use_bidirectional_attention is not supported: the kernels attend causally")
    act = raw.get("hidden_activation") or "gelu_pytorch_tanh"
    if act not in _GEMMA_ACTIVATIONS:
        raise ModelConfigError(f"Gemma's hidden_activation {act!r} is not supported ({', '.join(_GEMMA_ACTIVATIONS)})")
    raw = _gemma3_rope(raw) if family == "gemma3" else dict(raw)
    for name, value in _GEMMA_DEFAULTS[family].items():
        raw.setdefault(name, value)
    gemma2 = family == "gemma2"
    attn_cap = raw.get("attn_logit_softcapping", 50.0) if gemma2 else None
    final_cap = raw.get("final_logit_softcapping", 30.0 if gemma2 else None)
    return raw, {
        "layer_windows": _gemma_windows(raw, family),
        "attn_logit_softcap": float(attn_cap or 0.0),
        "final_logit_softcap": float(final_cap or 0.0),
        "query_pre_attn_scalar": float(raw.get("query_pre_attn_scalar", 256)),
        "local_rope_theta": 0.0 if gemma2 else float(raw.get("rope_local_base_freq", 10000.0)),
    }


def _gemma_windows(raw: dict[str, Any], family: str) -> tuple[int, ...]:
    """Each layer's window from layer_types, or Hugging Face's pattern without them: Gemma 2's
    sliding layers are the even ones, Gemma 3's all but every sliding_window_pattern-th (6)."""
    n = int(raw["num_hidden_layers"])
    pattern = 2 if family == "gemma2" else int(raw.get("sliding_window_pattern") or 6)
    types = raw.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if len(types) != n or unknown:
        raise ModelConfigError(
            f"Gemma layer_types must name sliding_attention or full_attention for each of {n} layers, "
            f"got {len(types)} with {sorted(unknown) or 'no unknown types'}"
        )
    window = int(raw.get("sliding_window", 4096) or 0)
    if window <= 0 and "sliding_attention" in types:
        raise ModelConfigError(
            f"Gemma sliding_attention layers need a sliding_window, got {raw.get('sliding_window')!r}"
        )
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def _gemma3_rope(raw: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's rotary fields in the classic spelling the rest of this module reads: rope_theta
    and rope_scaling for the full-attention layers, rope_local_base_freq for the sliding ones (from
    transformers 5's rope_parameters per layer type where config.json gives those). The sliding
    layers' rotary is unscaled in every Gemma 3; one with a scaling is refused."""
    raw = dict(raw)
    per_type = raw.get("rope_parameters") or {}
    if "full_attention" in per_type or "sliding_attention" in per_type:
        raw.pop("rope_parameters")
        full = dict(per_type.get("full_attention") or {})
        local = dict(per_type.get("sliding_attention") or {})
        raw["rope_theta"] = full.pop("rope_theta", 1000000.0)
        raw["rope_scaling"] = full if full.get("rope_type", "default") != "default" else None
        raw["rope_local_base_freq"] = local.pop("rope_theta", 10000.0)
        if local.get("rope_type", "default") != "default":
            raise ModelConfigError(f"Gemma 3's sliding layers with rope scaling {local} are not supported")
    raw.setdefault("rope_theta", 1000000.0)
    return raw
