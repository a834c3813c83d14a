"""Steps with prompt tokens under CUDA graphs, piecewise: everything but attention.

Launching an eager step's kernels one by one costs the H200's host 10–20 ms for a lone
prompt of a few hundred tokens (a cuBLAS call alone is about 40 µs of host time there), two
to three times what the device needs. Attention is the only part of a forward whose launch
depends on more than the token count (segments, prefixes, decode contexts, split counts).
So the pieces between two attentions (the model's ``piece``) are captured once per
token-count bucket over static buffers, and a step replays them in order with its own
attention launched eagerly in between: 33 graph launches and two attention kernels a
layer instead of a dozen launches a layer.

Tokens past the step's own are padding. Their K and V go to the pool's scratch slot, no
attention reads or writes their rows, and no logits are taken from them.

The pieces hand each other three things. The residual stream is one tensor per bucket,
updated in place. The QKV projection and the attention output go to static buffers
shared by every bucket, so no piece's output has to outlive the next piece. The pieces
of all buckets share one memory pool; they never run concurrently.
"""

from __future__ import annotations

import logging
import time

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.interface import CausalLM
from services.worker.models.weights import Carry

log = logging.getLogger(__name__)

DEFAULT_TOKEN_BUCKETS = (16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
                         1280, 1536, 1792, 2048)  # fmt: skip


def token_buckets_up_to(max_tokens: int) -> list[int]:
    out = [b for b in DEFAULT_TOKEN_BUCKETS if b < max_tokens]
    return [*out, max_tokens] if max_tokens > 0 else []


class PiecewiseGraphs:
    def __init__(
        self, model: CausalLM, dummy_slot: int, buckets: list[int], device: torch.device, capture: bool = True
    ) -> None:
        """capture=False runs the same pieces eagerly over the same buffers (the CPU tests)."""
        self.model = model
        self.dummy_slot = dummy_slot
        self.buckets = sorted(buckets)
        self.num_layers = model.num_layers
        n = self.buckets[-1]
        dtype = model.dtype
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)
        self.out_slots = torch.full((n,), dummy_slot, dtype=torch.int32, device=device)
        self.qkv = torch.zeros(n, model.qkv_size, dtype=dtype, device=device)
        self.o = torch.zeros(n, model.q_heads, model.head_dim, dtype=dtype, device=device)
        # bucket -> each piece's output (its q, k and v view self.qkv)
        self.carry: dict[int, list[Carry]] = {b: [] for b in self.buckets}
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        if capture:
            self._capture_all(device)
        else:
            for b in self.buckets:
                self._run_pieces(b)  # the carries' shapes, as a capture leaves them

    def fits(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.buckets[-1]

    def bucket(self, num_tokens: int) -> int:
        return next(b for b in self.buckets if b >= num_tokens)

    @torch.inference_mode()
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] (the weights' dtype) for batch.sample_index."""
        t = batch.num_tokens
        m = self.bucket(t)
        self.input_ids[:t].copy_(batch.input_ids)
        self.positions[:t].copy_(batch.positions)
        self.out_slots[:t].copy_(batch.out_slots)
        if m > t:  # a larger step may have left real slots there
            self.out_slots[t:m].fill_(self.dummy_slot)
        attn, carry, o = self.model.attn, self.carry[m], self.o[:m]
        graphs = self.graphs.get(m)
        for i in range(self.num_layers + 1):
            if i > 0:
                c = carry[i - 1]
                assert c.q is not None and c.k is not None and c.v is not None
                attn.attend(i - 1, c.q, c.k, c.v, batch, out=o)
            if graphs is None:
                self._piece(m, i)
            else:
                graphs[i].replay()
        return self.model.logits(carry[-1], batch.sample_index)

    def _piece(self, m: int, i: int) -> None:
        """Run piece i of bucket m over the static buffers; its output replaces carry[m][i]."""
        carry = self.carry[m]
        out = self.model.piece(
            i,
            self.o[:m] if i else None,
            carry[i - 1] if i else None,
            self.input_ids[:m],
            self.positions[:m],
            self.out_slots[:m],
            qkv_out=self.qkv[:m] if i < self.num_layers else None,
        )
        if i < len(carry):
            carry[i] = out
        else:
            carry.append(out)

    def _run_pieces(self, m: int) -> None:
        for i in range(self.num_layers + 1):
            self._piece(m, i)

    def _capture_all(self, device: torch.device) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        with torch.inference_mode():
            for m in reversed(self.buckets):  # largest first: the smaller ones reuse its memory
                stream.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(stream):
                    for _ in range(2):  # compile kernels and settle allocations outside the graphs
                        self._run_pieces(m)
                torch.cuda.synchronize(device)
                graphs = []
                with torch.cuda.stream(stream):
                    for i in range(self.num_layers + 1):
                        # not torch.cuda.graph(): it collects garbage and empties the cache at
                        # every capture, seconds over hundreds of small graphs
                        graph = torch.cuda.CUDAGraph()
                        graph.capture_begin(pool=pool)
                        try:
                            self._piece(m, i)
                        finally:
                            graph.capture_end()
                        graphs.append(graph)
                torch.cuda.current_stream(device).wait_stream(stream)
                self.graphs[m] = graphs
        torch.cuda.synchronize(device)
        log.info(
            "captured the pieces of steps of %d..%d tokens (%d buckets, %d graphs each) in %.1fs",
            self.buckets[0],
            self.buckets[-1],
            len(self.buckets),
            self.num_layers + 1,
            time.perf_counter() - t0,
        )
