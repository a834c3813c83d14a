"""Runs the model on a batch: decode-only batches replay a captured CUDA graph, steps with
prompt tokens of up to a few thousand tokens replay the captured pieces between their
attentions (piecewise_graphs.py), the rest run eagerly.

Every rank of a tensor-parallel group runs the same batches in the same order (rank 0 sends
each one to the others first), since each layer ends in a collective all ranks must join."""

from __future__ import annotations

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.runtime.decode_graphs import DecodeGraphs
from services.worker.runtime.folding import StepForward
from services.worker.runtime.graph_inputs import DecodeInputs
from services.worker.runtime.piecewise_graphs import PiecewiseGraphs
from services.worker.tp.channel import StepChannel


class ModelRunner:
    def __init__(
        self,
        step: StepForward,
        graphs: DecodeGraphs | None = None,
        channel: StepChannel | None = None,
        pieces: PiecewiseGraphs | None = None,
    ) -> None:
        self.step = step  # the eager forward, around the model
        self.model = step.model
        self.graphs = graphs
        self.channel = channel  # rank 0 of a tensor-parallel group: the other ranks run the same batch
        self.pieces = pieces
        # the decode graphs' input layout, in which decode-only batches are built for them
        self.staging: DecodeInputs | None = graphs.inputs if graphs is not None else None

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] (the weights' dtype) for batch.sample_index."""
        if self.channel is not None:
            self.channel.send(batch)
        if batch.rope_positions is not None:
            # M-RoPE's per-token rotary rows are an input no captured graph has (its decodes in the
            # graphs' layout carry one position each instead, rotary_positions)
            return self.step(batch)
        if self.graphs is not None and batch.num_extends == 0 and self.graphs.fits(batch.num_decodes):
            return self.graphs.replay(batch)
        # only steps with prompt tokens: a decode batch too large for the decode graphs keeps the
        # device busy far longer than its launch takes, and padding it to a bucket only adds work
        # (on an H200 at the 8B shape, 1025-2048 requests: 58-62 ms a step padded, 55.5 eager)
        # a step with images runs eagerly: the captured first piece embeds token ids only
        if (
            self.pieces is not None
            and batch.image_embeds is None
            and batch.num_extends > 0
            and self.pieces.fits(batch.num_tokens)
        ):
            return self.pieces.run(batch)
        return self.step(batch)
