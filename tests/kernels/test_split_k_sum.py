"""split_k_sum against PyTorch's sum over the shares, and the split rule's bounds."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.split_k_sum import MAX_SPLIT, choose_split, shares, split_k_sum


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("s", "m", "n"), [(1, 1, 64), (3, 5, 300), (16, 2, 4096)])
def test_split_k_sum(s: int, m: int, n: int, dtype: torch.dtype, device, tol) -> None:
    partials = torch.randn(s, m, n, device=device)
    out = torch.empty(m, n, dtype=dtype, device=device)
    assert split_k_sum(partials, out, accumulate=False) is out
    torch.testing.assert_close(out, partials.sum(0).to(dtype), **tol(dtype))


def test_accumulates_into_a_column_slice(device, tol) -> None:
    partials = torch.randn(4, 3, 100, device=device)
    buf = torch.randn(3, 160, device=device)
    want = buf.clone()
    want[:, 20:120] += partials.sum(0)
    split_k_sum(partials, buf[:, 20:120], accumulate=True)
    torch.testing.assert_close(buf, want, **tol(torch.float32))


def test_rejects_a_wrong_out(device) -> None:
    with pytest.raises(ValueError, match="out must be"):
        split_k_sum(torch.randn(2, 3, 64, device=device), torch.empty(3, 32, device=device), accumulate=False)


def test_the_split_rule() -> None:
    """Llama-3-8B's down projection (N 4096, K 14336) at int4 on 132 SMs: 9 shares at a batch of
    one (4 programs an SM), 3 at 64 (their sums' traffic a quarter of the weight's at most); a
    projection with enough tiles is not cut; a share keeps 4 steps; MAX_SPLIT at most."""
    k_steps, weight = 14336 // 128, 4096 * 14336 // 2
    at_1 = choose_split(64, k_steps, 1, 4096, weight, 132)
    at_64 = choose_split(64, k_steps, 64, 4096, weight, 132)
    assert at_1 == 9 and at_64 == 3
    assert choose_split(1, 10**4, 1, 64, 10**9, 132) == MAX_SPLIT
    assert choose_split(1024, k_steps, 1, 65536, weight * 16, 132) == 1
    assert choose_split(64, 8, 1, 4096, 10**9, 132) == 2
    assert shares(10, 4) == (3, 4) and shares(8, 3) == (3, 3) and shares(4, 16) == (1, 4)
