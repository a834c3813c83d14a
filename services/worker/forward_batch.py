"""The tensors that describe one model step.

Tokens are packed: first the extend segments (prefill chunks, or whole re-prefills of
resumed requests), one after another, then one token per decoding request. Every new
token gets a KV slot (``out_slots``); attention reads each request's earlier tokens
from the pool through its request-table row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class HostIndex:
    """The batch's index lists as the host built them: what the other ranks of a tensor-parallel
    group need besides the device-made input ids and slots, sent to them without a device sync."""

    positions: list[int] = field(default_factory=list)
    extend_rows: list[int] = field(default_factory=list)
    extend_starts: list[int] = field(default_factory=list)
    decode_rows: list[int] = field(default_factory=list)
    decode_seq_lens: list[int] = field(default_factory=list)
    sample_index: list[int] = field(default_factory=list)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int32, where each new token's K and V go
    req_table: torch.Tensor  # [rows, max_context] int32, the whole request-to-token table

    # extend segments: packed tokens [0, num_extend_tokens)
    num_extend_tokens: int
    extend_rows: torch.Tensor  # [Be] int32
    extend_starts: torch.Tensor  # [Be] int32, offset of each segment in the packed tokens
    extend_lens: torch.Tensor  # [Be] int32, new tokens of each segment
    extend_prefix_lens: torch.Tensor  # [Be] int32, tokens already in the pool before this step
    extend_max_len: int
    extend_lens_host: list[int]
    extend_prefix_lens_host: list[int]

    # decoding requests: packed tokens [num_extend_tokens, T), one each
    decode_rows: torch.Tensor  # [Bd] int32
    decode_seq_lens: torch.Tensor  # [Bd] int32, context length including the new token
    decode_max_len: int

    sample_index: torch.Tensor  # [S] int64, packed positions whose logits are sampled
    host: HostIndex | None = None  # set by build_batch on rank 0
    # a decode-only batch built for the decode graphs (runtime/graph_inputs.py): the buffer its inputs
    # are views of, laid out as the graphs' own, and its requests' table rows as int64
    staged: torch.Tensor | None = None
    sample_rows: torch.Tensor | None = None
    # images' embeddings in the step's prompt tokens: the packed positions they replace the token
    # embeddings of, and the rows that go there (batch_builder.py); None: no image in the step
    image_positions: torch.Tensor | None = None  # [N] int64
    image_embeds: torch.Tensor | None = None  # [N, H] in the model's dtype
    # M-RoPE (models/layers/mrope.py): each token's t, h and w positions, [3, T] int64; None where
    # every token's three are its position (text, and a family without M-RoPE)
    rope_positions: torch.Tensor | None = None
    # a decode-only batch in the decode graphs' layout: where rotary turns each new token, [Bd] int64
    # (its position plus its request's M-RoPE delta, which only qwen2_vl.py reads); None elsewhere
    rotary_positions: torch.Tensor | None = None

    @classmethod
    def decodes(
        cls,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_slots: torch.Tensor,
        req_table: torch.Tensor,
        rows: torch.Tensor,
        seq_lens: torch.Tensor,
        max_len: int,
        sample_index: torch.Tensor,
        host: HostIndex | None = None,
        staged: torch.Tensor | None = None,
        sample_rows: torch.Tensor | None = None,
        rotary_positions: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """A decode-only batch: one token per request, no extend segments."""
        empty = torch.zeros(0, dtype=torch.int32, device=input_ids.device)
        return cls(
            input_ids=input_ids,
            positions=positions,
            out_slots=out_slots,
            req_table=req_table,
            num_extend_tokens=0,
            extend_rows=empty,
            extend_starts=empty,
            extend_lens=empty,
            extend_prefix_lens=empty,
            extend_max_len=0,
            extend_lens_host=[],
            extend_prefix_lens_host=[],
            decode_rows=rows,
            decode_seq_lens=seq_lens,
            decode_max_len=max_len,
            sample_index=sample_index,
            host=host,
            staged=staged,
            sample_rows=sample_rows,
            rotary_positions=rotary_positions,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_extends(self) -> int:
        return int(self.extend_rows.shape[0])

    @property
    def num_decodes(self) -> int:
        return int(self.decode_rows.shape[0])
