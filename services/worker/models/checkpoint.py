"""A Hugging Face model directory's safetensors, read lazily by tensor name, and the cuts that
give a tensor-parallel rank its share: every family's loader (its file's ``load``) uses these."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from safetensors import safe_open
from tqdm import tqdm

from services.worker.models import fp8_formats, int4_formats
from services.worker.models.fp8_weight import Fp8Weight
from services.worker.models.int4_weight import Int4Weight
from services.worker.models.projections import is_projection
from services.worker.tp.parallel import TensorParallel
from shared.quant_config import WeightQuant


class WeightLoadError(RuntimeError):
    pass


def weight_files(model_dir: str) -> list[str]:
    """The checkpoint's files: safetensors (one file, or shards with their index) or, where there
    are none, PyTorch's .bin files (pytorch_model.bin, or shards with their index)."""
    for stem, ext in (("model", ".safetensors"), ("pytorch_model", ".bin")):
        index = os.path.join(model_dir, f"{stem}{ext}.index.json")
        if os.path.exists(index):
            with open(index) as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(model_dir, n) for n in names]
        single = os.path.join(model_dir, stem + ext)
        if os.path.exists(single):
            return [single]
        found = sorted(f for f in os.listdir(model_dir) if f.endswith(ext) and not f.startswith("training_args"))
        if found:
            return [os.path.join(model_dir, f) for f in found]
    raise WeightLoadError(f"no .safetensors or .bin weight files in {model_dir}")


class _BinFile:
    """A .bin checkpoint file as safe_open's handle: memory-mapped, tensors only (weights_only:
    no code in the file runs)."""

    def __init__(self, path: str) -> None:
        try:
            self.tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # a pickle with anything but tensors, or not a torch file
            raise WeightLoadError(f"{path} cannot be read as a PyTorch checkpoint of tensors: {e}") from None

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.tensors[name]


def _open(path: str):
    return _BinFile(path) if path.endswith(".bin") else safe_open(path, framework="pt", device="cpu")


class Checkpoint:
    """Tensor name -> tensor across all files of a checkpoint, read lazily; ``put`` moves a
    tensor to the serving device and dtype. In a checkpoint of int4 weights (quant), a projection's
    "<name>.weight" is read as an Int4Weight from its packed tensors (models/int4_formats.py); in
    an FP8 one, a projection's (a routed expert's too) as an Fp8Weight and any other FP8 tensor
    dequantized (models/fp8_formats.py); with FP8 made at load (quant.at_load), each projection is
    quantized whole, before a tensor-parallel cut, so a row-parallel share keeps its rows' scales."""

    def __init__(
        self,
        model_dir: str,
        dtype: torch.dtype,
        device: torch.device | str,
        progress: bool = True,
        quant: WeightQuant | None = None,
    ) -> None:
        self.handles = [_open(f) for f in weight_files(model_dir)]
        self.where = {name: h for h in self.handles for name in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        self.dtype = dtype
        self.device = device
        self.show_progress = progress
        self.quant = quant
        self.alias: dict[str, str] = {}  # a name the family reads -> the name stored (set_text_model)

    def set_text_model(self) -> None:
        """A vision-language checkpoint holds its language model under a prefix: llava-hf's
        language_model.model.* and language_model.lm_head, or transformers 5's (and Qwen2-VL's
        under transformers 4.5x) model.language_model.* (and lm_head at the top); read them by the
        text family's names. Qwen2-VL's released checkpoints hold it under those names already
        (model.*, the tower beside it under visual.*)."""
        if any(n.startswith("model.layers.") for n in self.where):
            self.alias = {}
        elif any(n.startswith("language_model.") for n in self.where):
            self.alias = {n.removeprefix("language_model."): n for n in self.where if n.startswith("language_model.")}
        elif any(n.startswith("model.language_model.") for n in self.where):
            inner = "model.language_model."
            self.alias = {"model." + n.removeprefix(inner): n for n in self.where if n.startswith(inner)}
        else:
            raise WeightLoadError("no language model (language_model.* or model.language_model.*) in the checkpoint")

    def get(self, name: str) -> torch.Tensor | Int4Weight | Fp8Weight:
        name = self.alias.get(name, name)
        handle = self.where.get(name)
        stem = name.removesuffix("weight")
        quant = self.quant
        packed = int4_formats.PACKED.get(quant.method, "") if quant is not None else ""
        if handle is None and packed and self.has(stem + packed):  # under an alias too (a LLaVA's)
            assert quant is not None
            return int4_formats.read(quant.method, self.get, stem, quant.group_size)
        if handle is None:
            raise WeightLoadError(f"tensor {name} missing from the checkpoint")
        if quant is not None and quant.method == "fp8":
            return self._fp8(name, stem, quant, handle)
        return handle.get_tensor(name)

    def _fp8(self, name: str, stem: str, quant: WeightQuant, handle) -> torch.Tensor | Fp8Weight:
        projection = is_projection(name)
        if quant.at_load:
            t = handle.get_tensor(name)
            return Fp8Weight.quantize(t.to(self.device)) if projection and t.dim() == 2 else t
        if stem + quant.scale_name not in self.where:
            return handle.get_tensor(name)
        if projection:
            return fp8_formats.read(self._raw, stem, quant)
        return fp8_formats.dequantize(handle.get_tensor(name), self._raw(stem + quant.scale_name), quant)

    def _raw(self, name: str) -> torch.Tensor:
        """The tensor stored under name, as stored."""
        return self.where[name].get_tensor(name)

    def has(self, name: str) -> bool:
        return self.alias.get(name, name) in self.where

    def put(self, t: torch.Tensor | Int4Weight | Fp8Weight) -> torch.Tensor | Int4Weight | Fp8Weight:
        return t.to(device=self.device, dtype=self.dtype).contiguous()

    def progress(self, num_layers: int) -> Iterable[int]:
        """range(num_layers), with a progress bar on a terminal only (a log file or a container's
        log keeps one line per event)."""
        return tqdm(
            range(num_layers), desc="loading weights", unit="layer", disable=None if self.show_progress else True
        )


@dataclass(frozen=True)
class Shard:
    """This rank's share of a tensor: by rows (column-parallel products), by columns (row-parallel
    products) or by vocabulary rows, padded to a multiple of the rank count."""

    tp: TensorParallel

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        return self._split(t, 0)

    def cols(self, t: torch.Tensor) -> torch.Tensor:
        return self._split(t, 1)

    def _split(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        if self.tp.size == 1:
            return t
        if t.shape[dim] % self.tp.size:
            raise WeightLoadError(f"dimension {t.shape[dim]} does not split over {self.tp.size} ranks")
        return t.chunk(self.tp.size, dim=dim)[self.tp.rank]

    def vocab(self, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        """-> (this rank's rows, its first token id)."""
        tp = self.tp
        if tp.size == 1:
            return t, 0
        per_rank = -(-t.shape[0] // tp.size)
        padded = torch.zeros(per_rank * tp.size, t.shape[1], dtype=t.dtype)
        padded[: t.shape[0]] = t
        return padded[tp.rank * per_rank : (tp.rank + 1) * per_rank], tp.rank * per_rank
