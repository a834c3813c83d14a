"""Tiny int4 checkpoints for tests: AWQ and GPTQ quantized from one tiny Llama's draws, each with
a twin holding its dequantized weights as a plain float32 checkpoint (what Hugging Face runs as
the reference), and the unquantized model itself."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.worker.models import int4_formats
from tools import make_tiny_model

# group size 128 needs projections' inputs that are multiples of 128
SHAPE = ["--hidden", "128", "--intermediate", "256", "--heads", "4", "--kv-heads", "2", "--seed", "0"]


def dequantized_copy(src: str, dst: str, method: str, group_size: int) -> None:
    """src's int4 checkpoint rewritten with each projection's dequantized float32 weight."""
    shutil.copytree(src, dst)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config")
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    out = {}
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        for name in f.keys():  # noqa: SIM118
            if name.endswith(".qweight"):
                stem = name.removesuffix("qweight")
                w = int4_formats.read(method, f.get_tensor, stem, group_size)
                out[stem + "weight"] = w.to(dtype=torch.float32).dequantize()
            elif not name.endswith((".qzeros", ".scales", ".g_idx")):
                out[name] = f.get_tensor(name)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def make(root: str) -> dict[str, str]:
    """-> {"plain", "awq", "gptq", "awq-g32", "gptq-g32"} and each quantized one's "<name>-dequantized":
    model directories under root (g32: group size 32, so that inputs split over two ranks in whole groups)."""
    out = {"plain": os.path.join(root, "plain")}
    make_tiny_model.main(["--out", out["plain"], *SHAPE])
    for method in ("awq", "gptq"):
        for name, group in ((method, 128), (method + "-g32", 32)):
            out[name] = os.path.join(root, name)
            make_tiny_model.main(["--out", out[name], *SHAPE, "--quant", method, "--group-size", str(group)])
            out[name + "-dequantized"] = os.path.join(root, name + "-dequantized")
            dequantized_copy(out[name], out[name + "-dequantized"], method, group)
    return out
