"""Prefetching a captured decode step's next weights into L2 from a second stream.

A plan says, per projection, how many bytes of its weights to ask L2 for while the kernels
before it run (0 or absent: none; None: all of them). ``L2Ahead.ask`` forks a side stream
off the current one at that point, so the prefetch starts once the kernels launched before
it are done (the product before has stopped using HBM) and runs beside the ones after it;
``join`` makes the current stream wait for the side stream again, as a CUDA graph's capture
needs before it ends. See kernels/l2_prefetch.py for why this helps a one-row step.
"""

from __future__ import annotations

import torch

from services.worker.kernels.l2_prefetch import CHUNK, l2_prefetch

PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")
_ALL = -1


def parse_plan(spec: str) -> dict[str, int | None]:
    """ "o=all,gate_up=16M,down=8M" -> {"o": None, "gate_up": 16 MiB, "down": 8 MiB}; "" -> {}."""
    plan: dict[str, int | None] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, amount = part.partition("=")
        if not sep or name not in PROJECTIONS:
            raise ValueError(f"l2 prefetch plan: {part!r} is not <projection>=<bytes|all>, projection in {PROJECTIONS}")
        plan[name] = None if amount == "all" else _bytes(amount, part)
    return plan


def _bytes(amount: str, part: str) -> int:
    scale = {"K": 2**10, "M": 2**20}.get(amount[-1:], 1)
    digits = amount[:-1] if scale > 1 else amount
    if not digits.isdigit():
        raise ValueError(f"l2 prefetch plan: {part!r}: the amount must be bytes (e.g. 4096, 64K, 16M) or all")
    return int(digits) * scale


class L2Ahead:
    def __init__(
        self, plan: dict[str, int | None], device: torch.device, line: bool = False, chunk: int = CHUNK
    ) -> None:
        self.plan = plan
        self.line = line
        self.chunk = chunk
        self.side = torch.cuda.Stream(device)
        self._forked = False

    def ask(self, name: str, w: torch.Tensor) -> None:
        """Prefetch the plan's share of w (projection name's weights) beside the next kernels."""
        nbytes = self.plan.get(name, 0)
        if nbytes == 0:
            return
        main = torch.cuda.current_stream(w.device)
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            l2_prefetch(w, nbytes, line=self.line, chunk=self.chunk)
        self._forked = True

    def join(self) -> None:
        if self._forked:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
            self._forked = False
