"""Wrap a model in what makes it fast, from the outside: norms folded into its weights where its
family declares it can, decode CUDA graphs per batch-size bucket (with the BLAS choice), the
piecewise graphs of steps with prompt tokens, all behind one ModelRunner."""

from __future__ import annotations

import logging

import torch

from services.worker.memory.req_table import ReqTable
from services.worker.models.interface import CausalLM
from services.worker.runtime.decode_graphs import DecodeGraphs, buckets_up_to
from services.worker.runtime.folding import FOLDED_MAX_BATCH, StepForward, fold_norms_
from services.worker.runtime.model_runner import ModelRunner
from services.worker.runtime.piecewise_graphs import PiecewiseGraphs, token_buckets_up_to
from services.worker.tp.channel import StepChannel
from shared.config import WorkerConfig

log = logging.getLogger(__name__)


def wants_folding(cfg: WorkerConfig, device: torch.device, tp_size: int) -> bool:
    """Folding is for one CUDA rank with a bf16/float pool: decode_folded adds each rank's partial
    products into the residual in place, and a quantized (int8, fp8) pool's decode kernel takes no norm."""
    return cfg.fold_norms and device.type == "cuda" and tp_size == 1 and cfg.kv_dtype == "auto"


def make_runner(
    cfg: WorkerConfig,
    model: CausalLM,
    table: ReqTable,
    dummy_slot: int,
    max_total_len: int,
    device: torch.device,
    tp_size: int,
    channel: StepChannel | None = None,
) -> ModelRunner:
    folded = wants_folding(cfg, device, tp_size) and fold_norms_(model)
    if folded:
        log.info(
            "norms folded into the products that read them: decode steps of up to %d requests run no norm "
            "kernel in a layer",
            FOLDED_MAX_BATCH,
        )
    step = StepForward(model, folded)
    graphs = None
    if device.type == "cuda" and cfg.cuda_graph_max_bs > 0:
        max_bs = min(cfg.cuda_graph_max_bs, cfg.running_max_req_size)
        buckets = buckets_up_to(max_bs)
        graphs = DecodeGraphs(
            step, table.table, dummy_slot, table.dummy_row, max_total_len, buckets, device, cfg.gemm_search
        )
    pieces = None
    # not yet under tensor parallelism: the pieces' collectives have not been run on two GPUs
    if device.type == "cuda" and cfg.cuda_graph_max_tokens > 0 and tp_size == 1:
        pieces = PiecewiseGraphs(model, dummy_slot, token_buckets_up_to(cfg.cuda_graph_max_tokens), device)
    return ModelRunner(step, graphs, channel, pieces)
