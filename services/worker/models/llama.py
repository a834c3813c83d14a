"""The Llama family (Llama 2 and 3, Mistral, Qwen2) over the token KV pool.

One forward runs a packed batch (see forward_batch.py) through every layer and returns
the logits of the positions to sample. The math follows Hugging Face's modeling code;
the steps that differ between the CPU and CUDA paths are the ops strategy and the
attention backend, passed in.

A forward is a chain of pieces with an attention between each two (``piece``): everything
but attention depends only on the token count, so piecewise_graphs.py captures the pieces
in CUDA graphs and runs each step's attention between them.

With the norms folded into the weights (fold.py), a decode-only step of up to
FOLDED_MAX_BATCH requests runs decode_folded: the residual stream is the products' input and
their sum, and no norm kernel runs in a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.attention.base import AttentionBackend
from services.worker.blas_choice import Choice, matmul, run
from services.worker.cublaslt import CublasLt
from services.worker.forward_batch import ForwardBatch
from services.worker.ops import LayerOps, RowNorm
from services.worker.parallel import TensorParallel
from shared.model_config import ModelConfig

# the most requests a decode step runs decode_folded for. Its kernels each compute their rows'
# inverse RMS from the residual, once a program: decode attention's (request, KV head, split) and
# silu_mul's (row, 1024 columns). On an H200 at the 8B shape (docs/benchmarks.md, r103, r104)
# that saved 0.06-0.15 ms a step at batches 1-64, and cost 0.6 ms at 257-512 requests and 2.5 ms
# past 1024; larger steps keep their norm kernels (with the folded weights' unit norms).
FOLDED_MAX_BATCH = 64


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 * Hkv) * D, H], this rank's heads
    qkv_bias: torch.Tensor | None  # [(Hq + 2 * Hkv) * D]
    o: torch.Tensor  # [H, Hq * D]
    mlp_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H], this rank's share of the intermediate size
    down: torch.Tensor  # [H, I]


@dataclass
class Carry:
    """What one piece of a forward hands the next."""

    residual: torch.Tensor  # [T, H], the residual stream so far
    h: torch.Tensor | None = None  # [T, H], the last piece's: the last MLP's output, not yet in the residual
    q: torch.Tensor | None = None  # [T, Hq, D], the next layer's attention inputs (its K and V already stored)
    k: torch.Tensor | None = None  # [T, Hkv, D]
    v: torch.Tensor | None = None


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V / tp, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V / tp, H]; the embedding itself when tied
    vocab_start: int = 0  # first token id of this rank's vocabulary shard
    folded: bool = False  # the layers' norms folded into qkv and gate_up (fold.py), their own weights ones


class LlamaModel:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        ops: LayerOps,
        attn: AttentionBackend,
        cos_sin: torch.Tensor,
        tp: TensorParallel,
    ) -> None:
        if weights.folded and tp.size > 1:
            raise ValueError("folded norms need one rank: decode_folded adds each rank's partial products in place")
        self.cfg = cfg
        self.w = weights
        self.ops = ops
        self.attn = attn
        self.cos_sin = cos_sin  # [max_pos, D] float32
        self.tp = tp
        self.q_heads = cfg.num_heads // tp.size
        self.kv_heads = cfg.num_kv_heads // tp.size
        self.head_dim = cfg.head_dim
        self.q_size = self.q_heads * cfg.head_dim
        self.kv_size = self.kv_heads * cfg.head_dim
        # projection name -> what runs it, set while a decode graph is captured (blas_choice.py), and
        # the cuBLASLt handle that runs a chosen algorithm
        self.blas: dict[str, Choice] | None = None
        self.lt: CublasLt | None = None

    def projections(self) -> dict[str, list[torch.Tensor]]:
        """Each projection's weights [N, K], one per layer (the LM head's once)."""
        names = ("qkv", "o", "gate_up", "down")
        out = {n: [getattr(layer, n) for layer in self.w.layers] for n in names}
        return out | {"lm_head": [self.w.lm_head]}

    def runs_folded(self, decode_batch: int) -> bool:
        """Whether a decode-only step of decode_batch requests runs decode_folded."""
        return self.w.folded and decode_batch <= FOLDED_MAX_BATCH

    def accumulating(self, decode_batch: int) -> frozenset[str]:
        """The projections that a decode step of decode_batch requests adds into their output (the
        residual): o and down when the step runs decode_folded."""
        return frozenset({"o", "down"}) if self.runs_folded(decode_batch) else frozenset()

    def _proj(
        self, name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False
    ) -> torch.Tensor:
        if self.blas is None:  # eager steps: nothing to look up on the hot path
            return matmul(x, w, out, accumulate)
        return run(self.blas[name], self.lt, x, w, out, accumulate)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] (the weights' dtype) for batch.sample_index. A decode-only step leaves rotary and
        the KV store to the attention backend's decode_attend (a kernel fewer a layer)."""
        decode_only = batch.num_extends == 0
        if decode_only and self.runs_folded(batch.num_tokens):
            return self.decode_folded(batch)
        c = self.piece(0, None, None, batch.input_ids, batch.positions, batch.out_slots, store=not decode_only)
        for i in range(len(self.w.layers)):
            assert c.q is not None and c.k is not None and c.v is not None
            if decode_only:
                o = self.attn.decode_attend(i, c.q, c.k, c.v, batch, self.cos_sin, self.ops.rotary_)
            else:
                o = self.attn.attend(i, c.q, c.k, c.v, batch)  # [T, Hq, D]
            c = self.piece(i + 1, o, c, batch.input_ids, batch.positions, batch.out_slots, store=not decode_only)
        return self.logits(c, None if decode_only else batch.sample_index)

    def piece(
        self,
        i: int,
        o: torch.Tensor | None,
        carry: Carry | None,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_slots: torch.Tensor,
        qkv_out: torch.Tensor | None = None,
        store: bool = True,
    ) -> Carry:
        """The part of a forward between attention i - 1 and attention i: layer i - 1's output
        projection and MLP (from its attention output o [T, Hq, D]), then layer i's norm, QKV
        projection, rotary embedding and KV store. Piece 0 starts at the embedding; piece
        num_layers ends after the last MLP. qkv_out [T, (Hq + 2 Hkv) D]: where the QKV
        projection goes (q, k and v are views of it), else a new tensor. store=False leaves q and
        k unrotated and k, v out of the pool, for the backend's decode_attend."""
        eps = self.cfg.rms_norm_eps
        if i == 0:
            h = self.tp.embed(input_ids, self.w.embed, self.w.vocab_start)  # [T, H]
            residual = h
            x = self.ops.rmsnorm(h, self.w.layers[0].attn_norm, eps)
        else:
            assert o is not None and carry is not None
            layer, residual = self.w.layers[i - 1], carry.residual
            h = self.tp.all_reduce(self._proj("o", o.reshape(o.shape[0], self.q_size), layer.o))
            h = self._mlp(layer, self.ops.add_rmsnorm(h, residual, layer.mlp_norm, eps))
            if i == len(self.w.layers):
                return Carry(residual, h=h)
            x = self.ops.add_rmsnorm(h, residual, self.w.layers[i].attn_norm, eps)
        q, k, v = self._qkv(self.w.layers[i], x, qkv_out)
        if store:
            self.attn.rotary_store(i, q, k, v, positions, self.cos_sin, out_slots, self.ops.rotary_)
        return Carry(residual, q=q, k=k, v=v)

    def decode_folded(self, batch: ForwardBatch) -> torch.Tensor:
        """A decode-only step with the norms folded into the weights (fold.py; one GPU) -> logits
        [S, V]. A layer: qkv from the residual; decode attention, which scales q, k and v by
        the attention norm's factor; o added into the residual; gate_up from the residual;
        silu_mul, which scales by the MLP norm's factor; down added into the residual."""
        eps = self.cfg.rms_norm_eps
        residual = self.tp.embed(batch.input_ids, self.w.embed, self.w.vocab_start)  # [T, H], a tensor of its own
        t = residual.shape[0]
        for i, layer in enumerate(self.w.layers):
            norm = RowNorm(residual, eps)
            q, k, v = self._qkv(layer, residual)
            o = self.attn.decode_attend(i, q, k, v, batch, self.cos_sin, self.ops.rotary_, norm=norm)
            self._proj("o", o.reshape(t, self.q_size), layer.o, residual, accumulate=True)
            a = self.ops.silu_mul(self._proj("gate_up", residual, layer.gate_up), norm)
            self._proj("down", a, layer.down, residual, accumulate=True)
        return self._lm_head(self.ops.rmsnorm(residual, self.w.final_norm, eps))  # every row sampled, in order

    def _qkv(
        self, layer: LayerWeights, x: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The QKV projection of x [T, H] (into out [T, (Hq + 2 Hkv) D] when given) -> q [T, Hq, D],
        k and v [T, Hkv, D], views of it."""
        t = x.shape[0]
        qkv = self._proj("qkv", x, layer.qkv, out)
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        q = qkv[:, : self.q_size].view(t, self.q_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.kv_heads, self.head_dim)
        return q, k, v

    def logits(self, last: Carry, sample_index: torch.Tensor | None) -> torch.Tensor:
        """The last piece's output -> logits [S, V] of the rows sample_index [S] (None:
        every row, in order, as a decode-only step samples; the final norm then adds into the
        carry's residual in place, which nothing reads after it)."""
        h, residual = last.h, last.residual
        assert h is not None
        if sample_index is not None:  # gathers, so the in-place add touches copies
            h, residual = h[sample_index], residual[sample_index]
        return self._lm_head(self.ops.add_rmsnorm(h, residual, self.w.final_norm, self.cfg.rms_norm_eps))

    def _lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm's output [S, H] -> logits [S, V] in the weights' dtype. Not widened to
        float32 here: a greedy step's argmax reads them as they are (the same choice), and the
        sampler widens them for what needs it (penalties, temperature, log-probabilities)."""
        logits = self.tp.gather_vocab(self._proj("lm_head", x, self.w.lm_head))
        return logits[:, : self.cfg.vocab_size]

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        a = self.ops.silu_mul(self._proj("gate_up", x, layer.gate_up))  # [T, I]
        return self.tp.all_reduce(self._proj("down", a, layer.down))
