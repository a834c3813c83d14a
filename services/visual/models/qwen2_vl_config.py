"""What a Qwen2-VL or Qwen2.5-VL config.json's vision_config says about the vision tower.

Qwen2-VL's tower: LayerNorm, a quick-GELU MLP (width embed_dim * mlp_ratio), full attention in
every block; its output is hidden_size wide (the language model's). Qwen2.5-VL's: RMSNorm, a
SwiGLU MLP (intermediate_size), attention within windows of window_size pixels except in the
blocks fullatt_block_indexes names; its width is hidden_size and its output out_hidden_size.
Both: patches of patch_size pixels over temporal_patch_size frames, merged 2x2
(spatial_merge_size) into one language-model token by the patch merger, 2-D rotary in each
block over the patch's row and column.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.vision_config import QWEN_VL, VisionConfig


@dataclass(frozen=True)
class QwenVisionConfig:
    family: str  # qwen2_vl | qwen2_5_vl
    depth: int
    width: int  # the blocks' hidden size
    heads: int
    mlp_width: int
    out_width: int  # the merger's output: the language model's hidden size
    act: str  # quick_gelu (Qwen2-VL's MLP) | silu (Qwen2.5-VL's gate)
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    in_channels: int = 3
    window_size: int = 0  # pixels; 0: every block attends over the whole image (Qwen2-VL)
    full_blocks: tuple[int, ...] = ()  # with windows, the blocks that attend over the whole image
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.width % self.heads or (self.width // self.heads) % 4:
            raise ValueError(f"vision width {self.width} over {self.heads} heads must be a multiple of 4 a head")
        if self.window_size and self.window_size % (self.patch_size * self.merge_size):
            raise ValueError(f"window_size {self.window_size} must be a multiple of patch * merge size")
        if any(not 0 <= b < self.depth for b in self.full_blocks):
            raise ValueError(f"fullatt_block_indexes {self.full_blocks} outside the {self.depth} blocks")

    @property
    def rms_norm(self) -> bool:
        """Qwen2.5-VL's blocks and merger norm by RMS (no bias); Qwen2-VL's are LayerNorms."""
        return self.family == "qwen2_5_vl"

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def patch_dim(self) -> int:
        """One patch's pixel values: channels x frames x rows x columns."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def window_blocks(self) -> int:
        """A window's side in merged patches (language-model tokens)."""
        return self.window_size // (self.patch_size * self.merge_size)

    @classmethod
    def of(cls, vision: VisionConfig) -> QwenVisionConfig:
        """From a Qwen2-VL or Qwen2.5-VL model's VisionConfig (its config.json's vision_config)."""
        family, v = vision.family, vision.tower
        if family not in QWEN_VL:
            raise ValueError(f"vision family {family!r} is not Qwen2-VL or Qwen2.5-VL")
        common = {
            "family": family,
            "depth": int(v["depth"]),
            "heads": int(v["num_heads"]),
            "act": str(v.get("hidden_act") or ("quick_gelu" if family == "qwen2_vl" else "silu")),
            "patch_size": int(v.get("patch_size", 14)),
            "temporal_patch_size": int(v.get("temporal_patch_size", 2)),
            "merge_size": int(v.get("spatial_merge_size", 2)),
            "in_channels": int(v.get("in_channels") or v.get("in_chans") or 3),
            "rope_theta": float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        }
        if family == "qwen2_vl":
            width = int(v["embed_dim"])
            return cls(
                **common, width=width, mlp_width=int(width * v.get("mlp_ratio", 4)), out_width=int(v["hidden_size"])
            )
        return cls(
            **common,
            width=int(v["hidden_size"]),
            mlp_width=int(v["intermediate_size"]),
            out_width=int(v["out_hidden_size"]),
            window_size=int(v.get("window_size", 112)),
            full_blocks=tuple(int(b) for b in v.get("fullatt_block_indexes", ())),
        )
