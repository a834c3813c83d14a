"""``lightstream serve`` from each model source a user brings: PyTorch .bin weights, sharded
safetensors with their index, and a Hugging Face model id found in the local cache with
HF_HUB_OFFLINE=1; each answers Hugging Face's greedy text."""

from __future__ import annotations

import json
import os
import shutil
import signal

import httpx
import torch
from safetensors.torch import load_file, save_file

from tests import hf_reference
from tests.lightstream.test_serve import _serve, _wait_ready
from tools.redis_server import free_port

PROMPT = "The quick brown fox jumps over the lazy dog."


def _bin(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    os.remove(os.path.join(dst, "model.safetensors"))
    torch.save(load_file(os.path.join(src, "model.safetensors")), os.path.join(dst, "pytorch_model.bin"))
    return dst


def _sharded(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    os.remove(os.path.join(dst, "model.safetensors"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    names, weight_map = sorted(tensors), {}
    for k in range(2):
        part = f"model-{k + 1:05d}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in names[k::2]}, os.path.join(dst, part))
        weight_map |= dict.fromkeys(names[k::2], part)
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return dst


def _hub(src: str, hub: str) -> str:
    repo = os.path.join(hub, "models--acme--tiny-llama")
    shutil.copytree(src, os.path.join(repo, "snapshots", "0123abcd"))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write("0123abcd")
    return "acme/tiny-llama"


def test_bin_sharded_and_hub_id_models_serve_hf_greedy_text(tiny_llama: str, tmp_path, monkeypatch) -> None:
    want = hf_reference.greedy(tiny_llama, hf_reference.tokenizer(tiny_llama)(PROMPT)["input_ids"], 10)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models = {
        "bin": _bin(tiny_llama, str(tmp_path / "bin")),
        "sharded": _sharded(tiny_llama, str(tmp_path / "sharded")),
        "hub": _hub(tiny_llama, str(tmp_path / "hub")),
    }
    for kind, model in models.items():
        port = free_port()
        proc = _serve(model, "--port", str(port), "--host", "127.0.0.1", "--log-dir", str(tmp_path / kind))
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url, proc)
            body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "return_details": True}}
            r = httpx.post(url + "/generate", json=body, timeout=120)
            assert r.status_code == 200, (kind, r.text)
            assert [t["id"] for t in r.json()["tokens"]] == want, kind
            if kind == "hub":  # served under its id, as vLLM does
                assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"] == model
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, kind
