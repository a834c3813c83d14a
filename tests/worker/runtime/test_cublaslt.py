"""cuBLASLt called directly (services/worker/runtime/cublaslt.py): the column-major mapping of x @ w.t() on
any machine; on a GPU, every algorithm the heuristic offers computes PyTorch's product, eagerly
and replayed from a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from services.worker.runtime import cublaslt
from services.worker.runtime.cublaslt import CublasLt, binding_allowed, column_major_shape, major_minor


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


def test_x_at_w_transposed_maps_to_cublas_m_n_k_and_leading_dimensions() -> None:
    x = torch.empty(3, 16)[:, :8]  # rows of 8 within rows of 16: ldb 16
    w = torch.empty(40, 8)
    out = torch.empty(3, 40)
    assert column_major_shape(x, w, out) == (40, 3, 8, 8, 16, 40)


@pytest.mark.parametrize(
    ("x", "w", "out", "message"),
    [
        (torch.empty(3, 8), torch.empty(40, 9), torch.empty(3, 40), "cannot go into"),
        (torch.empty(3, 8), torch.empty(40, 8), torch.empty(3, 41), "cannot go into"),
        (torch.empty(8, 3).t(), torch.empty(40, 8), torch.empty(3, 40), "x must have unit stride"),
        (torch.empty(3, 8), torch.empty(8, 40).t(), torch.empty(3, 40), "w must have unit stride"),
        (torch.empty(3, 8, 1), torch.empty(40, 8), torch.empty(3, 40), "2-D operands"),
    ],
)
def test_operands_cublaslt_cannot_take_are_refused(x, w, out, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        column_major_shape(x, w, out)


@gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 3072, 1024), (48, 1024, 3584), (256, 2048, 512)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_offered_algorithm_computes_the_product(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    lt = CublasLt(torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * k**-0.5
    ref = x.float() @ w.float().t()
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    algos = lt.algos(x, w, out)
    assert len(algos) >= 2 and [a.rank for a in algos] == sorted(a.rank for a in algos)
    for a in algos:
        out.zero_()
        lt.matmul(x, w, out, a)
        rel = ((out.float() - ref).norm() / ref.norm()).item()
        assert rel < 1e-2, (a.describe(), rel)


@gpu
def test_a_graph_records_the_chosen_algorithm() -> None:
    lt = CublasLt(torch.device("cuda"))
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16) * 1024**-0.5
    out = torch.empty(64, 4096, device="cuda", dtype=torch.bfloat16)
    algo = lt.algos(x, w, out)[-1]  # the heuristic's last offer, not what PyTorch would run
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        lt.matmul(x, w, out, algo)
    x.copy_(torch.randn_like(x))  # the graph reads its inputs at replay
    graph.replay()
    torch.cuda.synchronize()
    ref = x.float() @ w.float().t()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


@gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 4096, 4096), (64, 4096, 3584)])
def test_every_neighbour_of_the_first_choice_computes_the_product(m: int, n: int, k: int) -> None:
    lt = CublasLt(torch.device("cuda"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    first = lt.algos(x, w, out)[0]
    near = lt.neighbours(x, w, out, first)
    assert near and all(a.rank == -1 and a.words != first.words for a in near)
    assert len({a.words for a in near}) == len(near)
    ref = x.float() @ w.float().t()
    for a in near:
        out.zero_()
        lt.matmul(x, w, out, a)
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, a.describe()


@pytest.mark.parametrize(
    ("version", "allowed"),
    [(130100, True), (130104, True), (130000, False), (130200, False), (120905, False), (140100, False)],
)
def test_only_a_tested_cublaslt_major_minor_is_bound(version: int, allowed: bool) -> None:
    ok, why = binding_allowed(version)
    assert ok == allowed
    assert f"cuBLASLt {version // 10000}.{version // 100 % 100}" in why
    assert ("never tested" in why) != allowed


def test_the_tested_table_can_be_given() -> None:
    assert binding_allowed(120800, tested=((12, 8), (13, 1)))[0]
    assert major_minor(130100) == (13, 1)


def test_a_handle_that_cannot_be_made_falls_back_to_torch_with_a_log_line(monkeypatch, caplog) -> None:
    def missing() -> None:
        raise OSError("libcublasLt could not be found")

    monkeypatch.setattr(cublaslt, "_library", missing)
    with caplog.at_level("WARNING", logger="services.worker.runtime.cublaslt"):
        assert CublasLt.checked(torch.device("cpu")) is None
    assert "PyTorch's matmul runs instead" in caplog.text and "could not be found" in caplog.text


@gpu
def test_the_live_cublaslt_passes_its_self_test(caplog) -> None:
    with caplog.at_level("INFO", logger="services.worker.runtime.cublaslt"):
        lt = CublasLt.checked(torch.device("cuda"))
    assert lt is not None and lt.self_test(torch.device("cuda")) is None
    assert "passed its self-test" in caplog.text


@gpu
def test_an_untested_cublaslt_is_not_bound(monkeypatch) -> None:
    monkeypatch.setattr(cublaslt, "TESTED_CUBLASLT", ((99, 0),))
    with pytest.raises(RuntimeError, match="never tested"):
        CublasLt(torch.device("cuda"))
    assert CublasLt.checked(torch.device("cuda")) is None
