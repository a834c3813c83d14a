"""The BLAS library chosen per projection for captured decode steps. GPU only."""

from __future__ import annotations

import pytest
import torch

from services.worker.blas_choice import LIBRARIES, choose_libraries, prefer, time_matmuls
from services.worker.build import build_engine
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


def test_choose_libraries_times_both_and_names_one_per_projection() -> None:
    weights = [torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(8, 512, device="cuda", dtype=torch.bfloat16)
    assert all(time_matmuls(x, weights, lib, reps=2) > 0 for lib in LIBRARIES)
    choice = choose_libraries({"a": weights, "b": weights[:1]}, batch=8, reps=2)
    assert set(choice) == {"a", "b"} and set(choice.values()) <= set(LIBRARIES)


def test_every_captured_bucket_records_its_choice(tiny_models: dict[str, str]) -> None:
    cfg = WorkerConfig(model_dir=tiny_models["llama"], device="cuda", dtype="bfloat16", cuda_graph_max_bs=8,
                       max_total_token_num=4096)  # fmt: skip
    graphs = build_engine(cfg).runner.graphs
    assert graphs is not None and sorted(graphs.blas) == graphs.buckets
    for bs, choice in graphs.blas.items():
        assert set(choice) == PROJECTIONS and set(choice.values()) <= set(LIBRARIES), (bs, choice)
    assert graphs.model.blas is None  # eager forwards use PyTorch's default again
    del graphs
    torch.cuda.empty_cache()
