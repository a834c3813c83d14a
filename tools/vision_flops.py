"""A vision tower's floating-point operations per image, from its config, and the device's
measured bf16 matmul rate: what tools/bench_vision.py sets the encoder's images/s against.

    python tools/vision_flops.py [--device cuda] [--n 8192]   # prints {"matmul_TFLOPs": ...}

FLOPs count each multiply-add as two, for the matmuls and attention's two products (QK^T and
PV); norms, activations and softmax are left out (a few per cent at these widths):
  LLaVA (CLIP)  the patch embedding; each layer run up to vision_feature_layer: QKV and output
                projections (4 h^2 per token), the MLP (2 h i), attention (2 n^2 h a product);
                the two-layer projector over the tokens kept. LLaVA-NeXT: that per square.
  Qwen2-VL      the patch embedding (patch_dim x width); each block: QKV and output (4 w^2 per
                patch), the MLP (Qwen2.5-VL's SwiGLU 3 w m, Qwen2-VL's 2 w m), attention within
                each frame, or in Qwen2.5-VL's windowed blocks within each window; the merger.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shared.anyres import grid
from shared.vision_config import QWEN_VL, VisionConfig


def flops_per_image(cfg: VisionConfig, text_hidden: int, height: int, width: int) -> float:
    """The tower's and projector's FLOPs for one image of this size, as the processor prepares it."""
    if cfg.family in QWEN_VL:
        return _qwen_flops(cfg, height, width)
    squares = 1
    if cfg.family == "llava_next":
        down, across = grid(height, width, cfg.grid_pinpoints, cfg.image_size)
        squares += down * across
    return squares * _clip_square_flops(cfg, text_hidden)


def _clip_square_flops(cfg: VisionConfig, text_hidden: int) -> float:
    t = cfg.tower
    h, inter = int(t.get("hidden_size", 768)), int(t.get("intermediate_size", 3072))
    layers = int(t.get("num_hidden_layers", 12))
    depth = cfg.feature_layer % (layers + 1)  # the layers run (services/visual/clip.py)
    patches = cfg.patches_per_side**2
    n = patches + 1
    embed = 2 * patches * (3 * cfg.patch_size**2) * h
    layer = 2 * n * (4 * h * h + 2 * h * inter) + 2 * 2 * n * n * h
    kept = cfg.tokens_per_tile
    projector = 2 * kept * (h * text_hidden + text_hidden * text_hidden)
    return float(embed + depth * layer + projector)


def _qwen_flops(cfg: VisionConfig, height: int, width: int) -> float:
    from services.visual.models.qwen2_vl_config import QwenVisionConfig
    from services.visual.models.qwen2_vl_layout import frame_seqlens, windows
    from services.visual.processors.qwen2_vl import QwenImageProcessor

    v = QwenVisionConfig.of(cfg)
    grids = [QwenImageProcessor.from_dict(cfg.processor).grid(height, width)]
    n = sum(t * h * w for t, h, w in grids)

    def attention(cu) -> int:  # 2 n^2 w a product, over each segment
        lengths = [int(b - a) for a, b in itertools.pairwise(cu)]
        return 2 * 2 * v.width * sum(x * x for x in lengths)

    full = attention(frame_seqlens(grids).tolist())
    windowed = attention(windows(grids, v.merge_size, v.window_blocks)[1].tolist()) if v.window_size else full
    mlp = (3 if v.rms_norm else 2) * v.width * v.mlp_width
    per_block = 2 * n * (4 * v.width * v.width + mlp)
    blocks = sum(per_block + (windowed if v.window_size and i not in v.full_blocks else full) for i in range(v.depth))
    merged = v.width * v.merge_size**2
    merger = 2 * (n // v.merge_size**2) * (merged * merged + merged * v.out_width)
    return float(2 * n * v.patch_dim * v.width + blocks + merger)


def matmul_tflops(device: str = "cuda", n: int = 8192, repeats: int = 10) -> float:
    """A bf16 n x n x n matmul's rate on the device (float32 on the CPU), in TFLOP/s."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn_like(a)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        a @ b
    sync()
    t = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - t) / 1e12


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--n", type=int, default=8192, help="the matmul's side")
    args = ap.parse_args(argv)
    res = {"device": args.device, "n": args.n, "matmul_TFLOPs": matmul_tflops(args.device, args.n)}
    print(json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    main()
