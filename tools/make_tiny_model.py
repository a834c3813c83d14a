"""Write a tiny Hugging Face-format model directory: random weights from a seed and a
byte-level BPE tokenizer trained here on tools/data/corpus.txt.

    python tools/make_tiny_model.py --out DIR [--seed N]
        [--arch llama|qwen2|qwen3|phi3|mixtral|qwen2_moe|qwen3_moe|gemma2|gemma3]
        [--hidden 64] [--layers 2 (gemma: 4)] [--heads 4] [--kv-heads 2] [--intermediate 128]
        [--experts 4] [--top-k 2] [--moe-intermediate 48] [--shared-intermediate 96]
        [--mlp-only-layers I ...] [--vocab 1000] [--max-positions 1024] [--dtype float32]
        [--quant awq|gptq|w4a16|fp8|fp8-tensor|fp8-block] [--group-size 128] [--block-size 128]
        [--arch llava|llava_next [--image-size 32] [--patch-size 8] [--vision-hidden 32] [--vision-layers 3]]
        [--arch qwen2_vl|qwen2_5_vl]

qwen3's heads are twice hidden / heads wide (its config.json gives head_dim, which need not
be hidden / heads), and each layer has its per-head q and k norms. phi3 stores q, k and v as
one tensor and gate and up as another, and has LongRoPE scaling (Phi-3-mini-128k's shape,
shrunk: the context four times the original, a factor per rotary frequency). gemma2 and gemma3
have four layers, both kinds of attention among them, and an 8-token sliding window, so prompts
outrun it; Gemma's four norms a layer (weights near zero: they scale by 1 + w), a
query_pre_attn_scalar unequal to head_dim, tied embeddings. gemma2 soft-caps its attention
scores and its logits, with caps small enough to matter at these scales; gemma3 has its heads
twice hidden / heads wide with q and k norms, a local rotary base for its sliding layers and
linear rope scaling on its global ones.

The mixtures of experts store each expert's projections as their checkpoints do: mixtral's
block_sparse_moe.experts.{e}.w1/w2/w3 (each expert --moe-intermediate wide, which its config
calls intermediate_size); qwen2_moe's and qwen3_moe's mlp.experts.{e}.gate_proj/up_proj/
down_proj, qwen2_moe with a shared expert and its gate and Qwen2's QKV bias, qwen3_moe with
Qwen3's wide heads and head norms and renormalised top-k weights (norm_topk_prob, as
Qwen3-30B-A3B's config says). --mlp-only-layers makes those layers of a Qwen MoE dense.

llava and llava_next are LLaVA-1.5 and LLaVA-NeXT over the llama arch: a CLIP vision tower and
a two-layer projector (tools/tiny_vision.py), the image processor's files, and a chat template
that writes an image content part as <image>, in llava-hf's checkpoint layout. qwen2_vl and
qwen2_5_vl: Qwen2 with M-RoPE and a vision tower, its tokens, chat template and processor files
(tools/tiny_qwen_vl.py).

The output layer is scaled up so the next-token distribution is peaked: greedy choices
then do not hinge on the order of floating-point sums, which lets tests compare token
for token with Hugging Face transformers. The end-of-sequence row is scaled further so
greedy generations end on EOS now and then. Same arguments, same bytes. --quant writes every
layer's projections as 4-bit AWQ, GPTQ or compressed-tensors W4A16 tensors quantized from the
same draws (models/int4_formats.py), with config.json's quantization_config (hidden and intermediate
sizes multiples of the group size, the experts' too; any arch, the routed experts quantized,
the routers and a vision tower not: models/projections.py), or as FP8 e4m3 (models/fp8_formats.py,
any arch, the routed experts too): fp8 is compressed-tensors per channel with dynamic per-token
input scales, fp8-tensor compressed-tensors per tensor with static input scales, fp8-block
Hugging Face's fine-grained FP8 with --block-size square blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from safetensors.torch import save_file

from services.worker.models import fp8_formats, int4_formats
from tools import tiny_qwen_vl, tiny_vision
from tools.tiny_tokenizer import tokenizer_config, train_tokenizer

LLAMA_TOKENS = {"specials": ["<s>", "</s>", "<|im_start|>", "<|im_end|>"], "bos": "<s>", "eos": "</s>"}
QWEN_TOKENS = {"specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "bos": None, "eos": "<|endoftext|>"}
ARCHS = {
    # specials in id order; bos (or None), eos, the extra end-of-turn token
    "llama": LLAMA_TOKENS,
    "qwen2": QWEN_TOKENS,
    "qwen3": QWEN_TOKENS,
    "phi3": LLAMA_TOKENS,
    "mixtral": LLAMA_TOKENS,
    "qwen2_moe": QWEN_TOKENS,
    "qwen3_moe": QWEN_TOKENS,
    "gemma2": LLAMA_TOKENS,
    "gemma3": LLAMA_TOKENS,
    # LLaVA over a Llama language model: the image placeholder is a special token of the vocabulary
    "llava": {**LLAMA_TOKENS, "specials": [*LLAMA_TOKENS["specials"], tiny_vision.IMAGE_TOKEN]},
    "llava_next": {**LLAMA_TOKENS, "specials": [*LLAMA_TOKENS["specials"], tiny_vision.IMAGE_TOKEN]},
} | {a: {**QWEN_TOKENS, "specials": QWEN_TOKENS["specials"] + tiny_qwen_vl.SPECIALS} for a in tiny_qwen_vl.VL_ARCHS}
VISION = ("llava", "llava_next")
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
} | tiny_qwen_vl.ARCHITECTURES
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
GEMMA = ("gemma2", "gemma3")
QKV_BIAS = ("qwen2", "qwen2_moe", *tiny_qwen_vl.VL_ARCHS)
HEAD_NORMS = ("qwen3", "qwen3_moe")
WIDE_HEADS = (*HEAD_NORMS, "gemma3")  # heads twice hidden / heads wide
TIED = ("qwen2", "qwen3", *GEMMA)  # the output layer is the embedding, as in the small Qwen and every Gemma checkpoint
ROPE_THETA = {"llama": 500000.0, "qwen2": 10000.0, "qwen3": 1000000.0, "phi3": 10000.0}
ROPE_THETA |= {"mixtral": 1000000.0, "qwen2_moe": 1000000.0, "qwen3_moe": 1000000.0}
ROPE_THETA |= {"gemma2": 10000.0, "gemma3": 1000000.0} | dict.fromkeys(tiny_qwen_vl.VL_ARCHS, 1000000.0)
GEMMA_WINDOW = 8


def text_arch(args: argparse.Namespace) -> str:
    """The language model's architecture: a vision model's is Llama."""
    return "llama" if args.arch in VISION else args.arch


def head_dim(args: argparse.Namespace) -> int:
    return args.hidden // args.heads * (2 if args.arch in WIDE_HEADS else 1)


def random_weights(args: argparse.Namespace, vocab: int, eos_id: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(args.seed)
    d = head_dim(args)

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    def linear(out_f: int, in_f: int) -> torch.Tensor:
        return normal(out_f, in_f, std=in_f**-0.5)

    def norm() -> torch.Tensor:
        return 1.0 + normal(args.hidden, std=0.1)

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(vocab, args.hidden, std=1.0)}
    for i in range(args.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm()
        w[p + "self_attn.q_proj.weight"] = linear(args.heads * d, args.hidden)
        w[p + "self_attn.k_proj.weight"] = linear(args.kv_heads * d, args.hidden)
        w[p + "self_attn.v_proj.weight"] = linear(args.kv_heads * d, args.hidden)
        w[p + "self_attn.o_proj.weight"] = linear(args.hidden, args.heads * d)
        if args.arch in QKV_BIAS:
            w[p + "self_attn.q_proj.bias"] = normal(args.heads * d, std=0.1)
            w[p + "self_attn.k_proj.bias"] = normal(args.kv_heads * d, std=0.1)
            w[p + "self_attn.v_proj.bias"] = normal(args.kv_heads * d, std=0.1)
        if args.arch in HEAD_NORMS:
            w[p + "self_attn.q_norm.weight"] = 1.0 + normal(d, std=0.1)
            w[p + "self_attn.k_norm.weight"] = 1.0 + normal(d, std=0.1)
        if args.arch in GEMMA:  # Gemma's norms scale by 1 + w: their weights sit near zero
            w.update(gemma_norms(p, args, d, normal))
        w[p + "post_attention_layernorm.weight"] = norm() if args.arch not in GEMMA else normal(args.hidden, std=0.1)
        if args.arch in MOE and i not in args.mlp_only_layers:
            w.update(expert_weights(args, p, linear))
        else:
            w[p + "mlp.gate_proj.weight"] = linear(args.intermediate, args.hidden)
            w[p + "mlp.up_proj.weight"] = linear(args.intermediate, args.hidden)
            w[p + "mlp.down_proj.weight"] = linear(args.hidden, args.intermediate)
        if args.arch == "phi3":  # the same draws, stored fused as Phi-3's checkpoints are
            qkv = [w.pop(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
            w[p + "self_attn.qkv_proj.weight"] = torch.cat(qkv)
            gate_up = [w.pop(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
            w[p + "mlp.gate_up_proj.weight"] = torch.cat(gate_up)
    # with tied embeddings a positive final norm makes each token its own best successor
    # (logit = |embedding|^2); random signs break that self-attraction (Gemma's: 1 + w of random sign)
    w["model.norm.weight"] = normal(args.hidden, std=1.0) if args.arch in TIED else norm()
    if args.arch in GEMMA:
        w["model.norm.weight"] -= 1.0
    # peaked logits: each logit has a standard deviation of about args.logit_scale
    head = normal(vocab, args.hidden, std=args.logit_scale * args.hidden**-0.5)
    head[eos_id] *= args.eos_boost
    if args.arch in TIED:
        w["model.embed_tokens.weight"] = head
    else:
        w["lm_head.weight"] = head
    if args.arch in tiny_qwen_vl.VL_ARCHS:
        w |= tiny_qwen_vl.vision_weights(args, normal)
    dtype = getattr(torch, args.dtype)
    return {k: v.to(dtype).contiguous() for k, v in w.items()}


def expert_weights(args: argparse.Namespace, p: str, linear) -> dict[str, torch.Tensor]:
    """A sparse layer's router and experts (and Qwen2-MoE's shared expert) by its checkpoints' names."""
    h, inter = args.hidden, args.moe_intermediate
    mixtral = args.arch == "mixtral"
    moe = p + ("block_sparse_moe." if mixtral else "mlp.")
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    w = {moe + "gate.weight": linear(args.experts, h)}
    for e in range(args.experts):
        w[f"{moe}experts.{e}.{gate}.weight"] = linear(inter, h)
        w[f"{moe}experts.{e}.{up}.weight"] = linear(inter, h)
        w[f"{moe}experts.{e}.{down}.weight"] = linear(h, inter)
    if args.arch == "qwen2_moe":
        shared = args.shared_intermediate
        w[moe + "shared_expert.gate_proj.weight"] = linear(shared, h)
        w[moe + "shared_expert.up_proj.weight"] = linear(shared, h)
        w[moe + "shared_expert.down_proj.weight"] = linear(h, shared)
        w[moe + "shared_expert_gate.weight"] = linear(1, h)
    return w


def moe_fields(args: argparse.Namespace) -> dict:
    if args.arch == "mixtral":  # the experts' width is intermediate_size; no dense layer
        return {
            "intermediate_size": args.moe_intermediate,
            "num_local_experts": args.experts,
            "num_experts_per_tok": args.top_k,
            "router_jitter_noise": 0.0,
            "sliding_window": None,
        }
    out = {
        "num_experts": args.experts,
        "num_experts_per_tok": args.top_k,
        "moe_intermediate_size": args.moe_intermediate,
        "norm_topk_prob": args.arch == "qwen3_moe",
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(args.mlp_only_layers),
        "use_sliding_window": False,
        "sliding_window": None,
    }
    if args.arch == "qwen2_moe":
        out.update(shared_expert_intermediate_size=args.shared_intermediate, qkv_bias=True)
    return out


def model_config(args: argparse.Namespace, vocab: int, bos_id: int | None, eos_id: int) -> dict:
    arch = text_arch(args)
    cfg = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": "gemma3_text" if arch == "gemma3" else arch,  # gemma3: the multimodal one
        "vocab_size": vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": head_dim(args),
        "hidden_act": "silu",
        "max_position_embeddings": args.max_positions,
        "rms_norm_eps": 1e-5 if args.arch in ("llama", "phi3", "mixtral") else 1e-6,
        "rope_theta": ROPE_THETA[arch],
        "tie_word_embeddings": args.arch in TIED,
        "attention_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": args.dtype,
        "use_cache": True,
    }
    if arch == "llama":
        # Llama 3.1's scaling, shrunk to the tiny context, so that path is exercised too
        cfg["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": max(16, args.max_positions // 8),
        }
    elif args.arch == "phi3":
        cfg.update(
            phi3_fields(args), pad_token_id=eos_id
        )  # Hugging Face's default pad id, 32000, is past the vocabulary
    elif args.arch in MOE:
        cfg.update(moe_fields(args))
    elif args.arch in GEMMA:
        cfg.update(gemma_fields(args), pad_token_id=eos_id)
    else:
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
    return cfg


def phi3_fields(args: argparse.Namespace) -> dict:
    """LongRoPE over a context four times the original, with factors that grow with the
    wavelength as Phi-3's do, and a window as long as the whole context (Phi-3-mini-128k's)."""
    n = head_dim(args) // 2
    return {
        "original_max_position_embeddings": args.max_positions // 4,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": [round(1.0 + 0.5 * i / n, 4) for i in range(n)],
            "long_factor": [round(1.0 + 8.0 * i / n, 4) for i in range(n)],
        },
        "sliding_window": args.max_positions,
    }


def gemma_norms(p: str, args: argparse.Namespace, d: int, normal) -> dict[str, torch.Tensor]:
    """A Gemma layer's norms beyond Llama's two (input and post-attention), and Gemma 3's head norms."""
    w = {p + f"{n}_feedforward_layernorm.weight": normal(args.hidden, std=0.1) for n in ("pre", "post")}
    if args.arch == "gemma3":
        w |= {p + f"self_attn.{n}_norm.weight": normal(d, std=0.1) for n in "qk"}
    return w


def gemma_fields(args: argparse.Namespace) -> dict:
    """Gemma 2's or 3's own config.json fields (see the module's docstring)."""
    n = args.layers
    fields = {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 24,
        "sliding_window": GEMMA_WINDOW,
    }
    if args.arch == "gemma2":  # Hugging Face's default layer types: the even layers slide
        return fields | {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 6.0}
    types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(n)]
    return fields | {
        "layer_types": types,
        "sliding_window_pattern": 4,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    }


def write(out: str, args: argparse.Namespace) -> None:
    arch = ARCHS[args.arch]
    tok = train_tokenizer(args.vocab, arch["specials"], arch["bos"])
    vocab = tok.get_vocab_size()
    bos_id = tok.token_to_id(arch["bos"]) if arch["bos"] else None
    eos_id = tok.token_to_id(arch["eos"])
    end_of_turn = tok.token_to_id("<|im_end|>")
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    files = {
        "config.json": model_config(args, vocab, bos_id, eos_id),
        "generation_config.json": {"bos_token_id": bos_id, "eos_token_id": [eos_id, end_of_turn]},
        "tokenizer_config.json": tokenizer_config(arch, args.max_positions, args.arch in VISION),
        "special_tokens_map.json": {"bos_token": arch["bos"], "eos_token": arch["eos"], "pad_token": arch["eos"]},
    }
    if args.arch in tiny_qwen_vl.VL_ARCHS:
        tiny_qwen_vl.add_files(files, args, tok.get_vocab())
    weights = random_weights(args, vocab, eos_id)
    if args.arch in VISION:
        image_id = tok.token_to_id(tiny_vision.IMAGE_TOKEN)
        files["config.json"] = tiny_vision.llava_config(args, files["config.json"], image_id)
        files |= tiny_vision.processor_files(args)
        dtype = weights["model.norm.weight"].dtype
        vision = {k: v.to(dtype) for k, v in tiny_vision.vision_weights(args, args.hidden).items()}
        weights = tiny_vision.llava_layout(weights) | vision
    if args.quant in fp8_formats.KINDS:
        weights = fp8_formats.quantize_checkpoint(weights, args.quant, args.block_size)
        files["config.json"]["quantization_config"] = fp8_formats.quantization_config(args.quant, args.block_size)
    elif args.quant:
        weights = int4_formats.quantize_checkpoint(weights, args.quant, args.group_size)
        files["config.json"]["quantization_config"] = int4_formats.quantization_config(args.quant, args.group_size)
    for name, content in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump({k: v for k, v in content.items() if v is not None or name == "config.json"}, f, indent=2)
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=None, help="2 (gemma: 4, both kinds of attention)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128, help="the dense MLP's width")
    ap.add_argument("--experts", type=int, default=4, help="routed experts a sparse layer has (MoE archs)")
    ap.add_argument("--top-k", type=int, default=2, help="experts each token is routed to")
    ap.add_argument("--moe-intermediate", type=int, default=48, help="each routed expert's width")
    ap.add_argument("--shared-intermediate", type=int, default=96, help="qwen2_moe's shared expert's width")
    ap.add_argument("--mlp-only-layers", type=int, nargs="*", default=[], help="dense layers of a Qwen MoE")
    ap.add_argument("--vocab", type=int, default=1000, help="BPE vocabulary size to train (an upper bound)")
    ap.add_argument("--max-positions", type=int, default=1024)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--logit-scale", type=float, default=4.0, help="standard deviation of the logits")
    ap.add_argument("--eos-boost", type=float, default=1.8, help="extra scale of the EOS row of the output layer")
    ap.add_argument(
        "--quant", choices=["awq", "gptq", "w4a16", *fp8_formats.KINDS], help="quantized projections (docstring)"
    )
    ap.add_argument("--group-size", type=int, default=128, help="awq and gptq's group size")
    ap.add_argument("--block-size", type=int, default=128, help="fp8-block's block: rows and columns")
    tiny_vision.add_args(ap)
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.layers is None:
        args.layers = 4 if args.arch in GEMMA else 2
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise SystemExit("--hidden must divide by --heads, and --heads by --kv-heads")
    write(args.out, args)
    print(args.out)


if __name__ == "__main__":
    main()
