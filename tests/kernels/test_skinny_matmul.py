"""skinny_matmul kernel against a float32 matmul."""

from __future__ import annotations

import pytest
import torch

from services.worker.kernels.skinny_matmul import MAX_M, skinny_matmul


def _check(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, **config: int) -> None:
    x = torch.randn(m, k, dtype=dtype, device=device)
    w = torch.randn(n, k, dtype=dtype, device=device) / k**0.5
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
    ref = (x.float() @ w.float().t()).to(dtype)
    for _ in range(2):  # the second launch finds the split counters as the first left them
        out.fill_(float("nan"))
        skinny_matmul(x, w, out, **config)
        tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
        torch.testing.assert_close(out, ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("m", "n", "k", "config"),
    [
        (1, 48, 64, {}),
        (3, 40, 100, {}),  # N and K not a whole number of tiles
        (17, 64, 96, {}),  # a 32-row tile of x
        (5, 50, 300, {"SPLIT_K": 3, "BLOCK_K": 32}),  # the last split's K range is shorter
        (2, 32, 64, {"SPLIT_K": 4, "BLOCK_K": 16}),
        (4, 16, 40, {"SPLIT_K": 4, "BLOCK_K": 16}),  # the last split has no K at all
    ],
)
def test_skinny_matmul_small(m: int, n: int, k: int, config: dict, dtype: torch.dtype, device: torch.device) -> None:
    _check(m, n, k, dtype, device, **config)


def test_skinny_matmul_rejects_bad_arguments(device: torch.device) -> None:
    x = torch.randn(2, 8, device=device)
    with pytest.raises(ValueError, match="K=8"):
        skinny_matmul(x, torch.randn(4, 6, device=device))
    with pytest.raises(ValueError, match="at most"):
        skinny_matmul(torch.randn(MAX_M + 1, 8, device=device), torch.randn(4, 8, device=device))
    with pytest.raises(ValueError, match="dtype"):
        skinny_matmul(x, torch.randn(4, 8, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="out must be"):
        skinny_matmul(x, torch.randn(4, 8, device=device), torch.empty(2, 5, device=device))
    with pytest.raises(ValueError, match="SPLIT_K"):
        skinny_matmul(x, torch.randn(4, 8, device=device), SPLIT_K=0)


def test_skinny_matmul_of_no_rows(device: torch.device) -> None:
    assert skinny_matmul(torch.randn(0, 8, device=device), torch.randn(4, 8, device=device)).shape == (0, 4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 4, 16, 33, 64])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
def test_skinny_matmul_llama3_8b(m: int, n: int, k: int) -> None:
    _check(m, n, k, torch.bfloat16, torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("prefetch", [0, 256])
@pytest.mark.parametrize("split", [1, 4])
def test_skinny_matmul_pdl_waits_for_the_kernel_before(prefetch: int, split: int) -> None:
    """Launched with PDL, each product starts before the one before it ends: it must still read
    that one's output, eagerly and replayed from a CUDA graph."""
    dev, bf = torch.device("cuda"), torch.bfloat16
    ws = [torch.randn(4096, 4096, device=dev, dtype=bf) / 64 for _ in range(8)]
    x = torch.randn(2, 4096, device=dev, dtype=bf)
    ref = x.float()
    for w in ws:
        ref = (ref.to(bf).float() @ w.float().t()).to(bf).float()

    def chain() -> torch.Tensor:
        h = x
        for w in ws:
            h = skinny_matmul(h, w, pdl=True, SPLIT_K=split, PREFETCH=prefetch)
        return h

    torch.testing.assert_close(chain().float(), ref, rtol=5e-2, atol=5e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.testing.assert_close(out.float(), ref, rtol=5e-2, atol=5e-2)
