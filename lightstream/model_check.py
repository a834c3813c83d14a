"""A model directory checked before any service starts: config.json and its architecture,
weight files, tokenizer, and the serve settings against the model. A problem is one line
that says what was found and what is supported. Reads headers and small JSON files only, no
torch, so it answers well within two seconds."""

from __future__ import annotations

import glob
import json
import os
import struct
import zipfile

from lightstream.serve_config import ServeConfig
from shared.model_config import ModelConfig, ModelConfigError
from shared.quant_config import QuantConfigError, with_flag
from shared.vision_config import VisionConfigError

LAYOUT = (
    "a Hugging Face model directory (or a model id in the local Hugging Face cache): config.json, "
    "*.safetensors or *.bin weights, tokenizer.json or tokenizer.model"
)
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own bound on a header


class ModelCheckError(ValueError):
    pass


def check_model(model_dir: str, cfg: ServeConfig) -> ModelConfig:
    if not os.path.isdir(model_dir):
        raise ModelCheckError(f"{model_dir!r} is not a directory; supported: {LAYOUT}")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        raise ModelCheckError(f"{model_dir}: no config.json; supported: {LAYOUT}")
    try:
        model = ModelConfig.from_dir(model_dir)
        with_flag(model.quantization, cfg.quantization)
    except (ModelConfigError, QuantConfigError, VisionConfigError) as e:
        raise ModelCheckError(f"{model_dir}: {e}") from None
    except (KeyError, TypeError, ValueError) as e:  # config.json that is not JSON, or lacks a field
        raise ModelCheckError(f"{model_dir}/config.json cannot be read ({type(e).__name__}: {e}); {LAYOUT}") from None
    _check_weights(model_dir)
    _check_tokenizer(cfg.tokenizer or model_dir)
    if cfg.chat_template:
        _check_chat_template(cfg.chat_template)
    _check_settings(model, cfg)
    return model


def _check_weights(model_dir: str) -> None:
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    for path in files:
        _check_safetensors_header(path)
    if files:
        return
    bins = [p for p in sorted(glob.glob(os.path.join(model_dir, "*.bin"))) if "training_args" not in p]
    if not bins:
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(model_dir, "*.pt*")))
        found = f"only {', '.join(others[:3])}" if others else "no weight files"
        raise ModelCheckError(f"{model_dir}: {found}; supported: *.safetensors or PyTorch *.bin files")
    for path in bins:
        if not zipfile.is_zipfile(path):  # torch.save's format since PyTorch 1.6
            raise ModelCheckError(f"{path} is not a PyTorch checkpoint (torch.save's zip format)")


def _check_safetensors_header(path: str) -> None:
    """The 8-byte length and the JSON header that open every safetensors file."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if not 0 < n <= min(size - 8, MAX_HEADER_BYTES):
                raise ValueError(f"header length {n} in a file of {size} bytes")
            header = json.loads(f.read(n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        if max(ends, default=0) > size - 8 - n:
            raise ValueError(f"tensors end at byte {max(ends)} of {size - 8 - n}")
    except (struct.error, ValueError, KeyError, TypeError, IndexError) as e:
        raise ModelCheckError(f"{path} is not a readable safetensors file ({e})") from None


def _check_chat_template(spec: str) -> None:
    if os.path.isfile(spec):
        return
    if "{" not in spec:
        raise ModelCheckError(f"--chat-template {spec!r}: no such file, and not a Jinja template")


def _check_tokenizer(model_dir: str) -> None:
    if not os.path.isdir(model_dir):
        raise ModelCheckError(f"tokenizer {model_dir!r} is not a directory")
    fast = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(fast):
        from tokenizers import Tokenizer

        try:
            Tokenizer.from_file(fast)
        except Exception as e:  # the Rust library's own error type, whatever it is
            raise ModelCheckError(f"{fast} cannot be loaded ({e})") from None
        return
    if not os.path.exists(os.path.join(model_dir, "tokenizer.model")):
        raise ModelCheckError(f"{model_dir}: no tokenizer; supported: tokenizer.json or tokenizer.model")


def _check_settings(model: ModelConfig, cfg: ServeConfig) -> None:
    if model.vision is not None and cfg.tp > 1:
        raise ModelCheckError(f"--tp {cfg.tp}: a vision-language model runs on one rank per group for now (--tp 1)")
    if cfg.max_req_total_len > model.context_length:
        raise ModelCheckError(
            f"--max-model-len {cfg.max_req_total_len} is longer than the model's context ({model.context_length})"
        )
    widths = (("attention heads", model.num_heads), ("KV heads", model.num_kv_heads))
    if model.num_experts:  # each rank holds its share of every expert's width
        widths += (("experts' MLP columns", model.moe_intermediate_size),)
    if model.shared_expert_intermediate_size:
        widths += (("shared expert's MLP columns", model.shared_expert_intermediate_size),)
    for name, n in widths:
        if n % cfg.tp:
            raise ModelCheckError(f"--tp {cfg.tp} does not divide the model's {n} {name}")
