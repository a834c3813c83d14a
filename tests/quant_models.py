"""Tiny quantized checkpoints for tests, from one tiny Llama's draws: AWQ and GPTQ (int4), and FP8
per channel (compressed-tensors), per tensor (compressed-tensors, static input scales), per block
(Hugging Face fine-grained) and made at load (the unquantized checkpoint served with
--quantization fp8). Each has a twin holding the weights the worker serves, dequantized, as a plain
float32 checkpoint (what Hugging Face runs as the reference); and the unquantized model itself."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.worker.models import fp8_formats, int4_formats
from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.projections import is_projection
from shared.quant_config import FP8_AT_LOAD, WeightQuant, parse_quantization
from tools import make_tiny_model

# group size 128 needs projections' inputs that are multiples of 128
SHAPE = ["--hidden", "128", "--intermediate", "256", "--heads", "4", "--kv-heads", "2", "--seed", "0"]
INT4 = ("awq", "gptq", "w4a16")
FP8 = ("fp8", "fp8-tensor", "fp8-block", "fp8-at-load")
AT_LOAD = "fp8-at-load"  # served with WorkerConfig(quantization="fp8")


def quantization_flag(name: str) -> str:
    """The worker's --quantization for the model named name."""
    return "fp8" if name == AT_LOAD else "none"


def _served_weights(f, quant: WeightQuant) -> dict[str, torch.Tensor]:
    """Each tensor as the worker serves it, dequantized to float32 (no quantization's own tensors)."""
    names = set(f.keys())
    out = {}
    for name in names:
        stem = name.removesuffix("weight")
        if name.endswith((".qweight", ".weight_packed")):
            stem = name.removesuffix("qweight").removesuffix("weight_packed")
            w = int4_formats.read(quant.method, f.get_tensor, stem, quant.group_size)
            out[stem + "weight"] = w.to(dtype=torch.float32).dequantize()
        elif name.endswith((".qzeros", ".scales", ".g_idx", "_scale", "_scale_inv", ".weight_shape")):
            continue
        elif quant.method == "fp8" and name.endswith(".weight") and stem + quant.scale_name in names:
            if is_projection(name):  # a routed expert's too: Fp8Weight
                out[name] = fp8_formats.read(f.get_tensor, stem, quant).dequantize()
            else:
                out[name] = fp8_formats.dequantize(f.get_tensor(name), f.get_tensor(stem + quant.scale_name), quant)
        elif quant.at_load and is_projection(name):
            out[name] = Fp8Weight.quantize(f.get_tensor(name)).dequantize()
        else:
            out[name] = f.get_tensor(name)
    return out


def dequantized_copy(src: str, dst: str, at_load: bool = False) -> None:
    """src's checkpoint rewritten with each projection's served weight, dequantized to float32
    (at_load: as --quantization fp8 quantizes an unquantized checkpoint)."""
    shutil.copytree(src, dst)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    quant = FP8_AT_LOAD if at_load else parse_quantization(cfg)
    assert quant is not None, f"{src} holds no quantized checkpoint"
    cfg.pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with safe_open(os.path.join(src, "model.safetensors"), "pt") as f:
        out = _served_weights(f, quant)
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def make(root: str) -> dict[str, str]:
    """-> {"plain", "awq", "gptq", "awq-g32", "gptq-g32", "fp8", "fp8-tensor", "fp8-block", "fp8-at-load"}
    and each quantized one's "<name>-dequantized": model directories under root (g32: group size
    32, so that inputs split over two ranks in whole groups; fp8-block: 128 x 128 blocks)."""
    out = {"plain": os.path.join(root, "plain")}
    make_tiny_model.main(["--out", out["plain"], *SHAPE])
    quantized: list[tuple[str, list[str]]] = []
    for method in INT4:
        quantized += [(method, ["--quant", method]), (method + "-g32", ["--quant", method, "--group-size", "32"])]
    quantized += [(kind, ["--quant", kind]) for kind in FP8 if kind != AT_LOAD]
    for name, flags in quantized:
        out[name] = os.path.join(root, name)
        make_tiny_model.main(["--out", out[name], *SHAPE, *flags])
        out[name + "-dequantized"] = os.path.join(root, name + "-dequantized")
        dequantized_copy(out[name], out[name + "-dequantized"])
    out[AT_LOAD] = out["plain"]
    out[AT_LOAD + "-dequantized"] = os.path.join(root, AT_LOAD + "-dequantized")
    dequantized_copy(out["plain"], out[AT_LOAD + "-dequantized"], at_load=True)
    return out


def int4_copy(src: str, dst: str, method: str, group_size: int = 128, device: str = "cpu") -> str:
    """src's unquantized checkpoint (one model.safetensors) rewritten as AutoAWQ or auto-gptq would
    write it (int4_formats.quantize_checkpoint: round to nearest, quantized on device), config.json
    with its quantization_config. -> dst."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    with safe_open(path, "pt", device=device) as f:
        tensors = {name: f.get_tensor(name) for name in set(f.keys())}
    quantized = int4_formats.quantize_checkpoint(tensors, method, group_size)
    save_file({k: v.cpu().contiguous() for k, v in quantized.items()}, path, metadata={"format": "pt"})
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = int4_formats.quantization_config(method, group_size)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return dst
