"""The token bitmask of a step's constrained requests: filled on the host, applied on the device.

xgrammar writes each constrained request's allowed next tokens as a bitmask row (one bit per
token, int32 words) into a host buffer, in its own threads for a batch; the rows go to the
device in one copy and mask the logits in place (disallowed tokens to -inf) before sampling.
Only the constrained rows are filled, copied and masked: a step without constrained requests
does none of this, and unconstrained rows of a step with some are left as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xgrammar as xgr

from services.worker.grammar import GrammarState
from services.worker.host_copy import to_device


@dataclass
class StepMask:
    """The bitmask rows of one step, on the logits' device."""

    bitmask: torch.Tensor  # [rows, ceil(V / 32)] int32; row i masks logits row i
    # the sample indices it applies to: on CUDA a device tensor, since xgrammar would copy a list
    # from pageable memory, and such a copy waits for the device to finish the step's forward
    rows: list[int] | torch.Tensor
    vocab_size: int

    def apply(self, logits: torch.Tensor) -> None:
        """logits: [S, V], masked in place."""
        xgr.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=self.vocab_size, indices=self.rows)


class TokenMasks:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        shape = xgr.get_bitmask_shape(max_rows, vocab_size)
        cuda = device.type == "cuda"
        self.host = torch.full(shape, -1, dtype=xgr.bitmask_dtype, pin_memory=cuda)  # [rows, W]
        self.dev = torch.empty(shape, dtype=xgr.bitmask_dtype, device=device) if cuda else self.host
        self.batch = xgr.BatchGrammarMatcher()

    def fill(self, states: list[tuple[int, GrammarState]]) -> StepMask | None:
        """states: (sample index, grammar) of the step's constrained requests. The host buffer
        must not be in a copy still: the caller has waited for the step before (whose copy it was).
        None when no row needs a mask (every grammar has ended: their tokens are dropped)."""
        live = [(i, s.matcher) for i, s in states if s.needs_mask]
        if not live:
            return None
        rows = [i for i, _ in live]
        self.batch.batch_fill_next_token_bitmask([m for _, m in live], self.host, rows)
        n = max(rows) + 1
        if self.dev is self.host:
            return StepMask(self.host[:n], rows, self.vocab_size)
        self.dev[:n].copy_(self.host[:n], non_blocking=True)
        return StepMask(self.dev[:n], to_device(rows, torch.int32, self.device), self.vocab_size)
