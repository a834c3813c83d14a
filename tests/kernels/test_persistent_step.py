"""tools/diag/persistent_step.py's kernel (an experiment, not the worker's) against float64 torch:
three whole layers of one request's decode step (norms, qkv, rotary, attention over the cache
and the new token, its splits combined, o, the MLP) in one launch, and the new k and v it
stores in the cache. A one-program grid, so that its barriers pass under the interpreter."""

from __future__ import annotations

import pytest
import torch

from tools.diag.persistent_step import Step, random_weights, reference


@pytest.mark.parametrize(("pos", "splits"), [(13, 4), (0, 2), (15, 4)])
def test_three_layers_of_a_step_in_one_launch_match_torch(pos: int, splits: int, device: torch.device) -> None:
    layers, hidden, hq, hkv, d, inter, ctx = 3, 64, 4, 2, 16, 128, 16
    w = random_weights(layers, hidden, hq, hkv, d, inter, torch.float32, device, seed=1)
    kc = torch.randn(layers, ctx, hkv, d, device=device)
    vc = torch.randn(layers, ctx, hkv, d, device=device)
    theta = pos / 10000.0 ** (torch.arange(0, d, 2, device=device).float() / d)
    cos_sin = torch.cat([theta.cos(), theta.sin()])
    x = torch.randn(hidden, device=device)
    ref, new = reference(w, kc, vc, x, cos_sin, pos, layers)
    before = kc.clone()
    step = Step(w, kc, vc, (16, 32, 4, 2), splits, nprog=1)
    got = step(x, cos_sin, pos, layers)
    assert ((got.double() - ref).norm() / ref.norm()).item() < 1e-5
    for i, (k, v) in enumerate(new):
        torch.testing.assert_close(kc[i, pos].double(), k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(vc[i, pos].double(), v, rtol=1e-5, atol=1e-5)
    others = [t for t in range(ctx) if t != pos]
    assert torch.equal(kc[:, others], before[:, others])  # nothing else in the cache was written
    assert step.err.item() == 0 and step.cnt.item() == 6 * layers
