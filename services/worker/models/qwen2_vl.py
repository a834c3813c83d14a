"""The language model of Qwen2-VL and Qwen2.5-VL: Qwen2's layers (llama.py) with M-RoPE.

A step whose batch carries rope_positions ([3, T]: each token's t, h and w, mrope_index.py) turns
q and k by M-RoPE: the step's rotary table is one row per packed token (layers/mrope.py), read
at index t for token t, so the ordinary rotary paths apply it. Such a step rotates and stores in
every layer before attending (never the decode kernel's own rotary, which turns by the KV length);
the runtime runs it eagerly (runtime/model_runner.py). A batch's image rows (image_positions,
image_embeds: the visual service's output) replace those tokens' embeddings, as in every family.

A generated token's three positions are equal (its position plus its request's delta), so a
decode is ordinary rotary at that position: a decode-only batch in the decode graphs' layout
carries it (rotary_positions) and runs in the graphs, rotating and storing before the decode
attention as above. A batch with neither is Qwen2's forward exactly (text only, delta 0).

Checkpoint names: Qwen's released checkpoints put the language model under ``model.``
(``model.layers.*``, ``model.embed_tokens``), transformers 4.5x's and 5's save_pretrained under
``model.language_model.``; llama.load reads both (Checkpoint.set_text_model). The vision tower
(``visual.*`` or ``model.visual.*``) is services/visual's.
"""

from __future__ import annotations

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.attention.base import AttentionBackend
from services.worker.models.layers.mrope import mrope_cos_sin, section_streams
from services.worker.models.layers.ops import LayerOps
from services.worker.models.layers.projection import Project, plain
from services.worker.models.llama import LlamaModel
from services.worker.models.weights import ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig

ARCHITECTURES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")


class Qwen2VLModel(LlamaModel):
    folds_norms = False  # an M-RoPE decode runs forward, never decode_folded (and the QKV bias folds not)

    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        ops: LayerOps,
        attn: AttentionBackend,
        cos_sin: torch.Tensor,
        tp: TensorParallel,
        project: Project = plain,
    ) -> None:
        super().__init__(cfg, weights, ops, attn, cos_sin, tp, project)
        if not cfg.mrope_section:
            raise ValueError("a Qwen2-VL language model needs its config's mrope_section")
        self.streams = section_streams(cfg.mrope_section, self.cos_sin.device)  # [D]

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] for batch.sample_index."""
        with torch.inference_mode():
            if batch.rope_positions is not None:
                table = mrope_cos_sin(self.cos_sin, batch.rope_positions, self.streams)  # [T, D]
                positions = torch.arange(batch.num_tokens, device=table.device)  # token t reads row t
                return self._rotated(batch, table, positions, batch.sample_index)
            if batch.rotary_positions is not None and batch.num_extends == 0:
                return self._rotated(batch, self.cos_sin, batch.rotary_positions, None)  # every row, in order
        return super().forward(batch)

    def _rotated(
        self, batch: ForwardBatch, table: torch.Tensor, positions: torch.Tensor, sample: torch.Tensor | None
    ) -> torch.Tensor:
        """The forward with q and k turned by table's rows at positions [T], stored, then attended."""
        images = (batch.image_positions, batch.image_embeds) if batch.image_embeds is not None else None
        c = self.piece(0, None, None, batch.input_ids, positions, batch.out_slots, images=images, cos_sin=table)
        for i in range(self.num_layers):
            assert c.q is not None and c.k is not None and c.v is not None
            o = self.attn.attend(i, c.q, c.k, c.v, batch)  # [T, Hq, D]
            c = self.piece(i + 1, o, c, batch.input_ids, positions, batch.out_slots, cos_sin=table)
        return self.logits(c, sample)
