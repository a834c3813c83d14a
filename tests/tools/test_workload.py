"""tools/workload.py makes the same requests as the shared benchmark workload, request for request,
for every workload it defines. That file is shared/bench/workload.py beside the checkout (CI puts
shared/ there) or beside a folder above it (a worktree nested under the main checkout's parent);
the tests are skipped where there is none."""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest

from tools import workload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shared_workload_path() -> str | None:
    folder = os.path.dirname(ROOT)
    while True:
        candidate = os.path.join(folder, "shared", "bench", "workload.py")
        if os.path.exists(candidate):
            return candidate
        if os.path.dirname(folder) == folder:
            return None
        folder = os.path.dirname(folder)


@pytest.fixture(scope="module")
def shared() -> ModuleType:
    path = shared_workload_path()
    if path is None:
        pytest.skip("no shared/bench/workload.py beside the checkout or a folder above it")
    spec = importlib.util.spec_from_file_location("shared_bench_workload", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_sharegpt_shaped_matches(shared: ModuleType, seed: int) -> None:
    assert workload.sharegpt_shaped(2000, seed=seed) == shared.sharegpt_shaped(2000, seed=seed)


def test_sharegpt_shaped_defaults_match(shared: ModuleType) -> None:
    ours = workload.sharegpt_shaped(2000)
    assert ours == shared.sharegpt_shaped(2000)
    assert 220 < sum(i for i, _ in ours) / len(ours) < 230  # the shape every figure is quoted at


def test_shared_prefix_matches(shared: ModuleType) -> None:
    assert workload.shared_prefix() == shared.shared_prefix()
    small = dict(groups=5, per_group=3, system_len=40, question_len=7, output_len=9, vocab=32000, seed=3)
    assert workload.shared_prefix(**small) == shared.shared_prefix(**small)


def test_multi_turn_matches(shared: ModuleType) -> None:
    assert workload.multi_turn() == shared.multi_turn()
    small = dict(conversations=30, turns=8, max_context=1500, vocab=32000, seed=5)
    assert workload.multi_turn(**small) == shared.multi_turn(**small)


def test_every_shared_workload_is_here(shared: ModuleType) -> None:
    public = {name for name, value in vars(shared).items() if callable(value) and not name.startswith("_")}
    public -= {name for name in public if getattr(vars(shared)[name], "__module__", "") != shared.__name__}
    assert public <= set(dir(workload)), public - set(dir(workload))
