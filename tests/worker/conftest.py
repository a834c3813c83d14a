"""Fixtures of the worker's GPU tests: 1B-shaped models whose outputs mean something, and
sequences to run through them."""

from __future__ import annotations

import pytest
import torch

from tests.worker import peaked_models


@pytest.fixture(scope="session")
def model_1b(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Llama-3.2-1B-shaped model with random weights whose next-token distributions are
    peaked (tests/peaked_models.py: each family's 1B shape), written on the GPU."""
    path = str(tmp_path_factory.mktemp("llama-1b"))
    return peaked_models.build(peaked_models.FAMILIES_1B["llama"], path, "cuda")


@pytest.fixture(scope="session")
def sequences() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1000, 100_000, (384,), generator=g).tolist() for _ in range(4)]
