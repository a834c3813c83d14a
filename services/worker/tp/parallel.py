"""Tensor parallelism as its own layer: the model calls these and stays free of the strategy.

With one rank every method is the identity. With several (issue: tensor parallelism)
the worker builds a group over torch.distributed and each rank holds a shard of the
weights and of the KV heads.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


class TensorParallel:
    def __init__(self, rank: int = 0, size: int = 1, group: dist.ProcessGroup | None = None) -> None:
        self.rank = rank
        self.size = size
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def embed(self, ids: torch.Tensor, table: torch.Tensor, vocab_start: int) -> torch.Tensor:
        """Look ids up in this rank's vocabulary shard [V / size, H]; the sum over ranks is the embedding."""
        if self.size == 1:
            return F.embedding(ids, table)
        local = ids - vocab_start
        inside = (local >= 0) & (local < table.shape[0])
        out = F.embedding(local.clamp(0, table.shape[0] - 1), table)
        out.mul_(inside[:, None].to(out.dtype))
        return self.all_reduce(out)

    def agree_min(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's value (each rank sizes its pool from its own free memory)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device if dist.get_backend(self.group) == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[S, V / size] on each rank -> [S, V] on every rank."""
        if self.size == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)
