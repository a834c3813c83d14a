"""tools/diag/persistent_step.py's kernel (an experiment, not the worker's) against float64 torch:
three whole layers of one request's decode step (norms, qkv, rotary, attention over the cache
and the new token, its splits combined, o, the MLP) in one launch, with the request's tokens
scattered over a KV pool as in the engine, and the new k and v it stores there. A one-program
grid, so that its barriers pass under the interpreter."""

from __future__ import annotations

import pytest
import torch

from tools.diag.persistent_step import Step, random_weights, reference


@pytest.mark.parametrize(("pos", "splits"), [(13, 4), (0, 2), (15, 4)])
def test_three_layers_of_a_step_in_one_launch_match_torch(pos: int, splits: int, device: torch.device) -> None:
    layers, hidden, hq, hkv, d, inter, rows = 3, 64, 4, 2, 16, 128, 40
    w = random_weights(layers, hidden, hq, hkv, d, inter, torch.float32, device, seed=1)
    kc = torch.randn(layers, rows, hkv, d, device=device)
    vc = torch.randn(layers, rows, hkv, d, device=device)
    slots = torch.randperm(rows, device=device)[:16].to(torch.int32)  # the request's table row, scattered
    theta = pos / 10000.0 ** (torch.arange(0, d, 2, device=device).float() / d)
    cos_sin = torch.cat([theta.cos(), theta.sin()])
    x = torch.randn(hidden, device=device)
    ref, new = reference(w, kc, vc, x, cos_sin, slots, pos, layers)
    before = kc.clone()
    step = Step(w, kc, vc, (16, 32, 4, 2), splits, nprog=1)
    got = step(x, cos_sin, slots, pos, layers)
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-5
    new_row = int(slots[pos])
    for i, (k, v) in enumerate(new):
        torch.testing.assert_close(kc[i, new_row].double(), k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vc[i, new_row].double(), v, rtol=1e-5, atol=1e-5)
    others = [r for r in range(rows) if r != new_row]
    assert torch.equal(kc[:, others], before[:, others])  # nothing else in the pool was written
    assert step.err.item() == 0 and step.cnt.item() == 6 * layers
