"""Mixture-of-experts families over the token KV pool: Llama's layers (llama.py) whose MLP is
routed experts, the part every such family shares. The families' own files give their
checkpoint names and their differences: mixtral.py, qwen_moe.py.

A sparse layer's MLP (``MoEModel._mlp``) reads the MLP norm's output x [T, H]:
  - the router: x times the router's weight [E, H] -> logits, softmax in float32, the top k per
    token, renormalised where the family does (layers/moe.py's route);
  - the routed experts: each token through its k experts' SiLU-gated MLPs, weighted and summed
    (the ops strategy's ``experts``: PyTorch's loop over experts on the CPU, the Triton grouped
    GEMM on CUDA, chosen where the model is built, as for every other op);
  - Qwen2-MoE's shared expert, where the layer has one: a dense MLP in the layer's gate_up and
    down, scaled by the sigmoid of one more router row (stored after the experts' rows, so one
    product gives both), added to the experts' output.
A dense layer among sparse ones (Qwen MoE's mlp_only_layers, decoder_sparse_step) is Llama's.

Under tensor parallelism each rank holds its rows of every expert's gate and up and its columns
of every down, as of a dense MLP, and the router whole: each rank routes alike, its products
are partial sums, and one all-reduce after the MLP adds them, as after a dense MLP.

Nothing here needs the host: routing is softmax and top-k on the device and the kernels' grids
are fixed by the token count, so the runtime's CUDA graphs capture a sparse layer as any other.

The norms do not fold (``folds_norms`` False): a folded MLP norm leaves its factor r to the
kernel after the gate|up product, but the router reads the normed x too, and softmax(r * z) is
not softmax(z) scaled.
"""

from __future__ import annotations

import torch

from services.worker.forward_batch import ForwardBatch
from services.worker.models.checkpoint import Checkpoint, Shard, WeightLoadError
from services.worker.models.fp8_weight import Fp8ExpertWeight, Fp8Weight
from services.worker.models.int4_experts import Int4ExpertWeight
from services.worker.models.int4_weight import Int4Weight
from services.worker.models.layers.moe import route
from services.worker.models.layers.projection import matmul
from services.worker.models.llama import LlamaModel
from services.worker.models.random_weights import Draws, dense_random_weights
from services.worker.models.weights import Experts, ExpertWeight, LayerWeights, ModelWeights
from services.worker.tp.parallel import TensorParallel
from shared.model_config import ModelConfig


class MoEModel(LlamaModel):
    folds_norms = False  # the router reads the MLP norm's output (above)
    # the routing weights' dtype: Mixtral's router keeps them float32, the Qwen routers round
    # them to the logits' (the model's) dtype
    float32_routing_weights = False

    def projections(self) -> dict[str, list[torch.Tensor]]:
        """Attention's products, the dense layers' MLP (gate_up, down) and the shared experts'
        (shared_gate_up, shared_down), each name one shape. The router's product ([T, E]) is too
        small to be worth the runtime's BLAS choice; the experts' products are the grouped GEMM's."""
        layers = self.w.layers
        out = {n: [getattr(layer, n) for layer in layers] for n in ("qkv", "o")}
        dense = [layer for layer in layers if layer.experts is None]
        shared = [layer for layer in layers if layer.experts is not None and layer.gate_up is not None]
        for prefix, group in (("", dense), ("shared_", shared)):
            if group:
                out[prefix + "gate_up"] = [layer.gate_up for layer in group]
                out[prefix + "down"] = [layer.down for layer in group]
        return out | {"lm_head": [self.w.lm_head]}

    def fold_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return []

    def decode_folded(self, batch: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError("a mixture of experts' norms do not fold: its decode steps run forward")

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] (the MLP norm's output) -> the MLP's output [T, H], all-reduced."""
        experts = layer.experts
        if experts is None:
            return super()._mlp(layer, x)
        cfg, e = self.cfg, self.cfg.num_experts
        logits = matmul(x, experts.router)  # [T, E (+ 1: the shared expert's gate)]
        dtype = torch.float32 if self.float32_routing_weights else x.dtype
        weights, ids = route(logits[:, :e], cfg.num_experts_per_tok, cfg.norm_topk_prob, dtype)  # [T, k] each
        out = self.ops.experts(x, experts.w13, experts.w2, weights, ids)  # [T, H], this rank's partial sum
        if layer.gate_up is not None:  # the shared expert
            assert layer.down is not None
            a = self.ops.silu_mul(self.project("shared_gate_up", x, layer.gate_up))
            out += torch.sigmoid(logits[:, e:]) * self.project("shared_down", a, layer.down)
        return self.tp.all_reduce(out)


def load_experts(
    ckpt: Checkpoint, shard: Shard, prefix: str, names: tuple[str, str, str], num_experts: int
) -> tuple[ExpertWeight, ExpertWeight]:
    """Each expert's gate, up and down projections, named f"{prefix}{e}.{name}.weight" (names: the
    checkpoint's for gate, up and down) -> w13 [E, 2I, H] and w2 [E, H, I] on the serving device,
    this rank's share of I. Each expert is copied into place as it is read, so no second copy of
    a layer's experts is ever held. FP8 projections (an FP8 checkpoint's, or --quantization fp8's)
    stack into an Fp8ExpertWeight, their scales cut with their rows: a rank's gate and up rows
    keep their own scales, its columns of down the whole rows' scales. AWQ's and GPTQ's int4
    projections stack into an Int4ExpertWeight: gate and up cut by output columns of the packed
    tensors, down by whole groups of input rows (Int4Weight.chunk)."""
    gate, up, down = names
    w13 = w2 = torch.empty(0)
    for e in range(num_experts):
        p = f"{prefix}{e}."
        g = shard.rows(ckpt.get(p + gate + ".weight"))  # [I, H]
        d = shard.cols(ckpt.get(p + down + ".weight"))  # [H, I]
        if e == 0:
            w13 = _stack(ckpt, g, num_experts, 2 * g.shape[0])
            w2 = _stack(ckpt, d, num_experts, d.shape[0])
        _place(w13, e, 0, g)
        _place(w13, e, g.shape[0], shard.rows(ckpt.get(p + up + ".weight")))
        _place(w2, e, 0, d)
    return w13, w2


def _stack(ckpt: Checkpoint, first: torch.Tensor | Fp8Weight | Int4Weight, num_experts: int, rows: int) -> ExpertWeight:
    """Room for num_experts projections of rows rows, in the form of the first one read."""
    if isinstance(first, Fp8Weight):
        return Fp8ExpertWeight.empty(num_experts, rows, first.shape[1], ckpt.device)
    if isinstance(first, Int4Weight):
        return Int4ExpertWeight.empty(num_experts, rows, first.shape[1], first.group_size, ckpt.dtype, ckpt.device)
    return torch.empty(num_experts, rows, first.shape[1], dtype=ckpt.dtype, device=ckpt.device)


_FORMS = {Fp8ExpertWeight: Fp8Weight, Int4ExpertWeight: Int4Weight}  # a stack's form -> its experts'


def _place(stack: ExpertWeight, e: int, start: int, w: torch.Tensor | Fp8Weight | Int4Weight) -> None:
    """Expert e's rows from start set to w's."""
    if not isinstance(w, _FORMS.get(type(stack), torch.Tensor)):
        raise WeightLoadError(f"expert {e}: {type(w).__name__} where the experts before it are {type(stack).__name__}")
    if isinstance(stack, tuple(_FORMS)):
        stack.place(e, start, w)  # type: ignore[arg-type]  (w is of stack's form: checked above)
    else:
        stack[e, start : start + w.shape[0]].copy_(w)


def random_weights(
    cfg: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0, tp: TensorParallel | None = None
) -> ModelWeights:
    """Random weights of a mixture of experts' shapes (a checkpoint's, this rank's share): the
    dense layout's attention and embeddings, and in each sparse layer a router (and a shared
    expert's gate row) drawn alike on every rank, the experts and a shared expert by rank."""
    tp = tp or TensorParallel()
    widths = (cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size)
    if any(w % tp.size for w in widths):
        raise ValueError(f"the experts' widths {widths} must split over {tp.size} ranks")
    w = dense_random_weights(cfg, dtype, device, seed, tp, dense_mlp=lambda i: not cfg.sparse(i))
    draw = Draws(cfg, dtype, device, seed + 2, tp)
    h, inter, shared = cfg.hidden_size, cfg.moe_intermediate_size // tp.size, widths[1] // tp.size
    for i, layer in enumerate(w.layers):
        if not cfg.sparse(i):
            continue
        layer.experts = Experts(
            router=draw.normal(cfg.num_experts + (1 if shared else 0), h, std=h**-0.5, whole=True),
            w13=draw.normal(cfg.num_experts, 2 * inter, h, std=h**-0.5),
            w2=draw.normal(cfg.num_experts, h, inter, std=cfg.moe_intermediate_size**-0.5),
        )
        if shared:
            layer.gate_up = draw.normal(2 * shared, h, std=h**-0.5)
            layer.down = draw.normal(h, shared, std=widths[1] ** -0.5)
    return w
