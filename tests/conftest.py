"""Shared fixtures: tiny models built here, a real redis-server, Hugging Face references."""

from __future__ import annotations

import os
import sys

import pytest
import torch

# Triton kernels run under the interpreter where there is no GPU; this must be set before
# any kernel module is imported, whichever test module pytest collects first
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools import make_tiny_model  # noqa: E402
from tools.redis_server import RedisServer  # noqa: E402

ARCHS = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")
# the mixtures of experts: built only for the sessions whose tests ask for them (tiny_moe_models),
# so the many tests over tiny_models do not each run them too
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
VL_ARCHS = ("qwen2_vl", "qwen2_5_vl")


def _make(tmp_path_factory: pytest.TempPathFactory, archs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for arch in archs:
        path = str(tmp_path_factory.mktemp(f"tiny-{arch}"))
        make_tiny_model.main(["--out", path, "--arch", arch, "--seed", "0"])
        out[arch] = path
    return out


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """arch -> model directory, each made once per test session."""
    return _make(tmp_path_factory, ARCHS)


@pytest.fixture(scope="session")
def tiny_moe_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Mixture-of-experts arch -> model directory (4 experts, top-2), each made once per session."""
    return _make(tmp_path_factory, MOE_ARCHS)


@pytest.fixture(scope="session")
def tiny_vl_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Qwen2-VL and Qwen2.5-VL (tools/tiny_qwen_vl.py) -> model directory, each made once per session."""
    return _make(tmp_path_factory, VL_ARCHS)


@pytest.fixture(scope="session")
def tiny_quant(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny Llama's AWQ, GPTQ and FP8 checkpoints, their dequantized twins and the unquantized one
    (tests/quant_models.py), made once per session."""
    from tests import quant_models

    return quant_models.make(str(tmp_path_factory.mktemp("tiny-quant")))


@pytest.fixture(scope="session")
def tiny_llama(tiny_models: dict[str, str]) -> str:
    return tiny_models["llama"]


@pytest.fixture(scope="session")
def tiny_qwen(tiny_models: dict[str, str]) -> str:
    return tiny_models["qwen2"]


@pytest.fixture(scope="session")
def redis_server():
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A clean database for each test."""
    import redis

    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def tiny_llava(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny LLaVA-1.5 (CLIP tower, MLP projector, Llama language model), made once per session."""
    path = str(tmp_path_factory.mktemp("tiny-llava"))
    make_tiny_model.main(["--out", path, "--arch", "llava", "--seed", "0"])
    return path


@pytest.fixture(scope="session")
def tiny_llava_next(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny LLaVA-NeXT (any-resolution tiles over tiny_llava's shapes), made once per session."""
    path = str(tmp_path_factory.mktemp("tiny-llava-next"))
    make_tiny_model.main(["--out", path, "--arch", "llava_next", "--seed", "0"])
    return path
