"""tools/diag/persistent_mlp.py's kernel (an experiment, not the worker's) against float64 torch:
three layers' MLP halves in one launch. A one-program grid, so that its barriers pass under the
interpreter, which runs programs one after another; the GPU runs of docs/benchmarks.md (r83-r88)
check the full grid against the same reference."""

from __future__ import annotations

import pytest
import torch

from tools.diag.persistent_mlp import Chain, reference


@pytest.mark.parametrize("cfg", [(16, 32, 4), (8, 64, 4, 2), (16, 32, 4, 2, 0, 0), (16, 32, 4, 0, 0, 0, 1, 1, 3)])
def test_three_layers_in_one_launch_match_torch(cfg: tuple[int, ...], device: torch.device) -> None:
    hidden, inter, layers = 64, 128, 3
    wo = torch.randn(layers, hidden, hidden, device=device) / hidden**0.5
    wgu = torch.randn(layers, 2 * inter, hidden, device=device) / hidden**0.5
    wd = torch.randn(layers, hidden, inter, device=device) / inter**0.5
    r, x = torch.randn(hidden, device=device), torch.randn(hidden, device=device)
    nw = 1 + 0.1 * torch.randn(hidden, device=device)
    chain = Chain(wo, wgu, wd, r, nw, cfg, nprog=1)
    got = chain(x, layers)
    ref = reference(wo, wgu, wd, r, nw, x, layers)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5
    assert chain.err.item() == 0 and chain.cnt.item() == 3 * layers  # every barrier passed, none timed out
