"""What runs each projection of a captured decode step (a BLAS library, or a cuBLASLt algorithm
called directly), chosen by timing. GPU only."""

from __future__ import annotations

import pytest
import torch

from services.worker.build import build_engine
from services.worker.models.layers.projection import plain
from services.worker.runtime.blas_choice import LIBRARIES, choose, prefer, run
from services.worker.runtime.cublaslt import Algo, CublasLt
from shared.config import WorkerConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROJECTIONS = {"qkv", "o", "gate_up", "down", "lm_head"}


def test_a_graph_captured_under_cublaslt_computes_what_cublas_does() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(48, 1024, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16, generator=g) * 1024**-0.5
    before = torch.backends.cuda.preferred_blas_library()
    with prefer("cublas"):
        ref = (x @ w.t()).float()
    stream = torch.cuda.Stream()
    with prefer("cublaslt"):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            x @ w.t()  # warm-up on the capture stream, as DecodeGraphs does
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = x @ w.t()
    assert torch.backends.cuda.preferred_blas_library() == before
    graph.replay()
    torch.cuda.synchronize()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, rel


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_choose_names_a_library_or_an_algorithm_per_projection_and_it_computes_the_product(batch: int) -> None:
    lt = CublasLt(torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(batch)
    weights = [torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16, generator=g) * 512**-0.5 for _ in range(4)]
    down = [torch.randn(512, 1536, device="cuda", dtype=torch.bfloat16, generator=g) * 1536**-0.5 for _ in range(4)]
    choice = choose(
        {"a": weights, "b": weights[:1], "down": down}, batch, lt, layers=4, reps=2, accumulate=frozenset({"down"})
    )
    assert set(choice) == {"a", "b", "down"}
    for name, ws in (("a", weights), ("down", down)):
        c = choice[name]
        assert c in LIBRARIES or (isinstance(c, Algo) and c.shape[:3] == (ws[0].shape[0], batch, ws[0].shape[1]))
        x = torch.randn(batch, ws[0].shape[1], device="cuda", dtype=torch.bfloat16, generator=g)
        ref = x.float() @ ws[0].float().t()
        got = run(c, lt, x, ws[0], None)
        assert ((got.float() - ref).norm() / ref.norm()).item() < 1e-2, (name, c)
        into = torch.randn(batch, ws[0].shape[0], device="cuda", dtype=torch.bfloat16, generator=g)
        want = into.float() + ref
        run(c, lt, x, ws[0], into, accumulate=True)
        assert ((into.float() - want).norm() / want.norm()).item() < 1e-2, (name, c)


def test_without_a_cublaslt_handle_only_libraries_are_chosen() -> None:
    weights = [torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    assert set(choose({"a": weights}, 8, None, reps=2).values()) <= set(LIBRARIES)


def test_every_captured_bucket_records_its_choice(tiny_models: dict[str, str]) -> None:
    cfg = WorkerConfig(
        model_dir=tiny_models["llama"], device="cuda", dtype="bfloat16", cuda_graph_max_bs=8, max_total_token_num=4096
    )
    graphs = build_engine(cfg).runner.graphs
    assert graphs is not None and sorted(graphs.blas) == graphs.buckets
    assert graphs.lt is not None  # the graphs' algorithms run on its workspace
    for bs, choice in graphs.blas.items():
        assert set(choice) == PROJECTIONS, (bs, choice)
        assert all(c in LIBRARIES or isinstance(c, Algo) for c in choice.values()), (bs, choice)
        assert graphs.bucket(bs) == bs and graphs.bucket(bs - 1 or 1) <= bs
        described = graphs.described_blas(bs)
        assert described.keys() == choice.keys() and all(isinstance(d, str) and d for d in described.values())
    assert graphs.model.project is plain  # eager forwards use PyTorch's default again
    del graphs
    torch.cuda.empty_cache()


@pytest.mark.parametrize("batch", [1, 16])
def test_every_choice_adds_into_out_when_told_to_accumulate(batch: int) -> None:
    """run(..., accumulate=True): out += x @ w.t() in one GEMM (beta 1), as the folded decode
    step adds the o and down products into the residual, by a library and by each algorithm."""
    lt = CublasLt(torch.device("cuda"))
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = torch.randn(batch, 1536, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(512, 1536, device="cuda", dtype=torch.bfloat16, generator=g) * 1536**-0.5
    residual = torch.randn(batch, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    ref = residual.float() + x.float() @ w.float().t()
    scratch = torch.empty(batch, 512, device="cuda", dtype=torch.bfloat16)
    for c in (*LIBRARIES, *lt.candidates(x, w, scratch)):
        out = residual.clone()
        assert run(c, lt, x, w, out, accumulate=True).data_ptr() == out.data_ptr()
        assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2, c
