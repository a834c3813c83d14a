"""The visual service's configuration (services/visual/), beside shared/config.py's others."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import CommonConfig, _check, option


@dataclass(frozen=True)
class VisualConfig(CommonConfig):
    """A visual replica: images -> embeddings with the model's vision tower and projector."""

    model_dir: str = option("", "Hugging Face model directory of a vision-language model (required)")
    device: str = option("auto", "auto, cpu or cuda")
    dtype: str = option("auto", "auto (the model's, float32 on the CPU), float32, bfloat16 or float16")
    max_batch_images: int = option(32, "most images through the tower in one batch (across requests)")
    random_weights: bool = option(
        False, "draw the tower's weights from a seed on the device (benchmarks: no checkpoint needed)"
    )
    image_ttl_s: float = option(
        600.0, "an image's embeddings stay in Redis this long after their last use: sent again within it, not encoded"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(bool(self.model_dir), "model_dir is required")
        _check(self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {self.device}")
        _check(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype}",
        )
        _check(self.max_batch_images >= 1, "max_batch_images must be >= 1")
        _check(self.image_ttl_s > 0, "image_ttl_s must be > 0")
