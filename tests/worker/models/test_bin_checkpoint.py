"""A checkpoint of PyTorch .bin files (one, or shards with their index) loads as its
safetensors twin does."""

from __future__ import annotations

import json
import os
import shutil

import torch
from safetensors.torch import load_file

from services.worker.build import build_engine
from shared.config import WorkerConfig
from tests.worker.engine_driver import request, run


def _as_bin(model_dir: str, out: str, shards: int) -> str:
    shutil.copytree(model_dir, out)
    os.remove(os.path.join(out, "model.safetensors"))
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    if shards == 1:
        torch.save(tensors, os.path.join(out, "pytorch_model.bin"))
        return out
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        part = f"pytorch_model-{k + 1:05d}-of-{shards:05d}.bin"
        mine = names[k::shards]
        torch.save({n: tensors[n] for n in mine}, os.path.join(out, part))
        weight_map |= dict.fromkeys(mine, part)
    with open(os.path.join(out, "pytorch_model.bin.index.json"), "w") as f:
        json.dump({"weight_map": weight_map}, f)
    return out


def test_bin_checkpoints_give_the_same_outputs(tiny_llama: str, tmp_path) -> None:
    reqs = [request("a", [1, 5, 9, 200, 14], max_new_tokens=8), request("b", list(range(3, 30)), max_new_tokens=6)]
    want = run(build_engine(WorkerConfig(model_dir=tiny_llama, device="cpu")), reqs)
    for shards in (1, 3):
        model = _as_bin(tiny_llama, str(tmp_path / f"bin{shards}"), shards)
        got = run(build_engine(WorkerConfig(model_dir=model, device="cpu")), reqs)
        assert {r: o.tokens for r, o in got.items()} == {r: o.tokens for r, o in want.items()}
