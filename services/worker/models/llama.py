"""The Llama family (Llama 2 and 3, Mistral, Qwen2) over the token KV pool: its forward math and
its checkpoint's tensor names. The file to copy for a new dense architecture.

One forward runs a packed batch (forward_batch.py) through every layer and returns the logits
of the positions to sample. The math follows Hugging Face's modeling code; the ops strategy
(norms, rotary, SiLU-mul), the attention backend and the projection strategy are passed in.

A forward is a chain of pieces with an attention between each two (``piece``): everything but
attention depends only on the token count, so the runtime can capture the pieces in CUDA
graphs and run each step's attention between them.

With the norms folded into the weights (the runtime's folding), a decode step may run
``decode_folded``: the residual stream is the products' input and their sum, and no norm
kernel runs in a layer.
"""

from __future__ import annotations

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.attention.base import AttentionBackend
from services.worker.models.checkpoint import Checkpoint, Shard
from services.worker.models.layers.ops import LayerOps, RowNorm
from services.worker.models.layers.projection import Project, plain
from services.worker.models.weights import Carry, LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


class LlamaModel:
    folds_norms = True  # RMSNorm's weight multiplies the product's input columns: it folds

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
        self.cfg = cfg
        self.w = weights
        self.ops = ops
        self.attn = attn
        self.cos_sin = cos_sin  # [max_pos, D] float32
        self.tp = tp
        self.project = project
        self.num_layers = len(weights.layers)
        self.dtype = weights.embed.dtype
        self.q_heads = cfg.num_heads // tp.size
        self.kv_heads = cfg.num_kv_heads // tp.size
        self.head_dim = cfg.head_dim
        self.q_size = self.q_heads * cfg.head_dim
        self.kv_size = self.kv_heads * cfg.head_dim
        self.qkv_size = self.q_size + 2 * self.kv_size

    def cos_sin_of(self, layer: int) -> torch.Tensor:
        """The rotary table that turns the given layer's q and k: one for every layer here; a family
        whose layers differ overrides this (Gemma 3's sliding layers have a base of their own)."""
        return self.cos_sin

    def projections(self) -> dict[str, list[torch.Tensor]]:
        names = ("qkv", "o", "gate_up", "down")
        out = {n: [getattr(layer, n) for layer in self.w.layers] for n in names}
        return out | {"lm_head": [self.w.lm_head]}

    def fold_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if any(layer.qkv_bias is not None for layer in self.w.layers):
            # r * (x @ W.t()) + b is not what the unfolded layer computes, (r x g) @ W.t() + b
            return []
        return [p for layer in self.w.layers for p in ((layer.attn_norm, layer.qkv), (layer.mlp_norm, layer.gate_up))]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """-> logits [S, V] (the weights' dtype) for batch.sample_index. A decode-only step leaves rotary and
        the KV store to the attention backend's decode_attend (a kernel fewer a layer)."""
        decode_only = batch.num_extends == 0
        # a vision-language model's image rows (only Llama's first piece takes them; other families have none)
        images = {"images": (batch.image_positions, batch.image_embeds)} if batch.image_embeds is not None else {}
        c = self.piece(
            0, None, None, batch.input_ids, batch.positions, batch.out_slots, store=not decode_only, **images
        )
        for i in range(self.num_layers):
            assert c.q is not None and c.k is not None and c.v is not None
            if decode_only:
                o = self.attn.decode_attend(i, c.q, c.k, c.v, batch, self.cos_sin_of(i), self.ops.rotary_)
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
        images: tuple[torch.Tensor, torch.Tensor] | None = None,
        cos_sin: torch.Tensor | None = None,
    ) -> Carry:
        """Layer i - 1's output projection and MLP (from its attention output o [T, Hq, D]), then
        layer i's norm, QKV projection, rotary embedding and KV store. Piece 0 starts at the
        embedding; piece num_layers ends after the last MLP. qkv_out [T, (Hq + 2 Hkv) D]: where
        the QKV projection goes (q, k and v are views of it), else a new tensor. store=False
        leaves q and k unrotated and k, v out of the pool, for the backend's decode_attend.
        images (piece 0): (packed positions [N], rows [N, H]) that replace those tokens' embeddings.
        cos_sin: the rotary table positions index, else cos_sin_of(i) (M-RoPE's per-token rows, qwen2_vl.py)."""
        eps = self.cfg.rms_norm_eps
        if i == 0:
            h = self.tp.embed(input_ids, self.w.embed, self.w.vocab_start)  # [T, H]
            if images is not None:
                h[images[0]] = images[1].to(h.dtype)
            residual = h
            x = self.ops.rmsnorm(h, self.w.layers[0].attn_norm, eps)
        else:
            assert o is not None and carry is not None
            layer, residual = self.w.layers[i - 1], carry.residual
            h = self.tp.all_reduce(self.project("o", o.reshape(o.shape[0], self.q_size), layer.o))
            h = self._mlp(layer, self.ops.add_rmsnorm(h, residual, layer.mlp_norm, eps))
            if i == self.num_layers:
                return Carry(residual, h=h)
            x = self.ops.add_rmsnorm(h, residual, self.w.layers[i].attn_norm, eps)
        q, k, v = self._qkv(self.w.layers[i], x, qkv_out)
        if store:
            table = self.cos_sin_of(i) if cos_sin is None else cos_sin
            self.attn.rotary_store(i, q, k, v, positions, table, out_slots, self.ops.rotary_)
        return Carry(residual, q=q, k=k, v=v)

    def decode_folded(self, batch: ForwardBatch) -> torch.Tensor:
        """A decode-only step with the norms folded into the weights (one rank) -> logits [S, V].
        A layer: qkv from the residual; decode attention, which scales q, k and v by the
        attention norm's factor; o added into the residual; gate_up from the residual; silu_mul,
        which scales by the MLP norm's factor; down added into the residual."""
        eps = self.cfg.rms_norm_eps
        residual = self.tp.embed(batch.input_ids, self.w.embed, self.w.vocab_start)  # [T, H], a tensor of its own
        t = residual.shape[0]
        for i, layer in enumerate(self.w.layers):
            norm = RowNorm(residual, eps)
            q, k, v = self._qkv(layer, residual)
            o = self.attn.decode_attend(i, q, k, v, batch, self.cos_sin_of(i), self.ops.rotary_, norm=norm)
            self.project("o", o.reshape(t, self.q_size), layer.o, residual, accumulate=True)
            a = self.ops.silu_mul(self.project("gate_up", residual, layer.gate_up), norm)
            self.project("down", a, layer.down, residual, accumulate=True)
        return self._lm_head(self.ops.rmsnorm(residual, self.w.final_norm, eps))  # every row sampled, in order

    def _qkv(
        self, layer: LayerWeights, x: torch.Tensor, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The QKV projection of x [T, H] (into out [T, (Hq + 2 Hkv) D] when given) -> q [T, Hq, D],
        k and v [T, Hkv, D], views of it."""
        t = x.shape[0]
        qkv = self.project("qkv", x, layer.qkv, out)
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        q = qkv[:, : self.q_size].view(t, self.q_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, self.kv_heads, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.kv_heads, self.head_dim)
        return q, k, v

    def logits(self, last: Carry, sample_index: torch.Tensor | None) -> torch.Tensor:
        """The last piece's output -> logits [S, V] of the rows sample_index [S] (None: every row,
        in order, as a decode-only step samples; the final norm then adds into the carry's
        residual in place, which nothing reads after it)."""
        h, residual = last.h, last.residual
        assert h is not None
        if sample_index is not None:  # gathers, so the in-place add touches copies
            h, residual = h[sample_index], residual[sample_index]
        return self._lm_head(self.ops.add_rmsnorm(h, residual, self.w.final_norm, self.cfg.rms_norm_eps))

    def _lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm's output [S, H] -> logits [S, V] in the weights' dtype. Not widened to
        float32 here: a greedy step's argmax reads them as they are (the same choice), and the
        sampler widens them for what needs it (penalties, temperature, log-probabilities)."""
        logits = self.tp.gather_vocab(self.project("lm_head", x, self.w.lm_head))
        return logits[:, : self.cfg.vocab_size]

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        a = self.ops.silu_mul(self.project("gate_up", x, layer.gate_up))  # [T, I]
        return self.tp.all_reduce(self.project("down", a, layer.down))


def load(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard) -> ModelWeights:
    """The checkpoint's tensors by Hugging Face's Llama names, in LightStream's layout (this rank's shard)."""
    layers = []
    for i in ckpt.progress(cfg.num_layers):
        p = f"model.layers.{i}."
        gate_up, down = load_mlp(ckpt, shard, p + "mlp.")
        layers.append(LayerWeights(**load_attention(ckpt, cfg, shard, p), gate_up=gate_up, down=down))
    return assemble(ckpt, cfg, shard, layers)


def load_attention(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard, p: str) -> dict[str, torch.Tensor | None]:
    """A layer's norms and attention under prefix p ("model.layers.{i}.") by Llama's names, as
    LayerWeights' fields (this rank's shard)."""
    put = ckpt.put
    q, k, v = (shard.rows(ckpt.get(p + f"self_attn.{n}_proj.weight")) for n in "qkv")
    bias = None
    if cfg.qkv_bias:
        bias = put(torch.cat([shard.rows(ckpt.get(p + f"self_attn.{n}_proj.bias")) for n in "qkv"]))
    return {
        "attn_norm": put(ckpt.get(p + "input_layernorm.weight")),
        "qkv": put(torch.cat([q, k, v])),
        "qkv_bias": bias,
        "o": put(shard.cols(ckpt.get(p + "self_attn.o_proj.weight"))),
        "mlp_norm": put(ckpt.get(p + "post_attention_layernorm.weight")),
    }


def load_mlp(ckpt: Checkpoint, shard: Shard, p: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A SiLU-gated MLP's gate_proj, up_proj and down_proj under prefix p -> (gate_up [2I, H],
    down [H, I]), this rank's share of I."""
    gate = shard.rows(ckpt.get(p + "gate_proj.weight"))
    up = shard.rows(ckpt.get(p + "up_proj.weight"))
    return ckpt.put(torch.cat([gate, up])), ckpt.put(shard.cols(ckpt.get(p + "down_proj.weight")))


def assemble(ckpt: Checkpoint, cfg: ModelConfig, shard: Shard, layers: list[LayerWeights]) -> ModelWeights:
    """The layers with the embedding, the output layer and the final norm by Hugging Face's
    names, which the dense families share."""
    put = ckpt.put
    embed, vocab_start = shard.vocab(ckpt.get("model.embed_tokens.weight"))
    embed = put(embed)
    if cfg.tie_word_embeddings or not ckpt.has("lm_head.weight"):
        lm_head = embed
    else:
        lm_head = put(shard.vocab(ckpt.get("lm_head.weight"))[0])
    final_norm = put(ckpt.get("model.norm.weight"))
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head, vocab_start=vocab_start)
