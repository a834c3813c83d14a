"""Which of a checkpoint's tensors are a decoder layer's projections: the weights a quantized
checkpoint stores quantized (AutoAWQ, auto-gptq, compressed-tensors, fine-grained FP8) and that
--quantization fp8 quantizes at load. A vision tower's layers are not among them: the quantizers
leave a vision-language model's tower unquantized, and its own loader reads it."""

from __future__ import annotations

EXPERT_NAMES = ("w1", "w2", "w3")  # Mixtral's routed experts' gate, down and up
TOWERS = ("vision_tower.", "model.vision_tower.", "visual.", "model.visual.")  # LLaVA's, Qwen2-VL's


def is_projection(name: str) -> bool:
    """A decoder layer's projection weight: q/k/v/o, gate/up/down, phi3's fused qkv and gate_up,
    a shared expert's, and each routed expert's (Mixtral's w1, w3 and w2 too); not a router
    (mlp.gate, block_sparse_moe.gate) nor a shared expert's gate. Under a LLaVA's
    language_model. or a Qwen2-VL's model.language_model. too."""
    if ".layers." not in name or not name.endswith(".weight") or name.startswith(TOWERS):
        return False
    proj = name.rsplit(".", 2)[-2]
    return proj.endswith("_proj") or (".experts." in name and proj in EXPERT_NAMES)
