"""Runs the model on a batch: decode-only batches replay a captured CUDA graph, others run eagerly."""

from __future__ import annotations

import torch

from services.worker.cuda_graphs import DecodeGraphs
from services.worker.forward_batch import ForwardBatch
from services.worker.models.llama import LlamaModel


class ModelRunner:
    def __init__(self, model: LlamaModel, graphs: DecodeGraphs | None = None) -> None:
        self.model = model
        self.graphs = graphs

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> float32 logits [S, V] for batch.sample_index."""
        if self.graphs is not None and batch.num_extends == 0 and self.graphs.fits(batch.num_decodes):
            return self.graphs.replay(batch)
        return self.model.forward(batch)
