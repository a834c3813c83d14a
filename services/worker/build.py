"""Build an Engine from the worker's config: device, dtype, the model of its family (models/), its KV
pool (memory/), the runtime around it (runtime/), the scheduler, the sampler and the grammars."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial

import torch

from services.worker.engine import Engine
from services.worker.grammar import Grammars
from services.worker.memory.kv_cache import KV_QUANT_DTYPES, KVCache, KVLayout
from services.worker.memory.kv_manager import KVManager
from services.worker.memory.prompt_cache import PromptCache
from services.worker.memory.req_table import ReqTable
from services.worker.memory.token_allocator import TokenAllocator
from services.worker.models.attention.base import attention_layers
from services.worker.models.attention.torch_backend import TorchAttention
from services.worker.models.fp8_weight import Fp8Weight, quantize_layers_, quantize_lm_head_
from services.worker.models.int4_weight import Int4Weight
from services.worker.models.interface import CausalLM
from services.worker.models.layers.fp8_product import fp8_triton
from services.worker.models.layers.ops import TorchOps
from services.worker.models.layers.rope import cos_sin_table
from services.worker.models.registry import family_of, load_weights
from services.worker.models.weights import ModelWeights
from services.worker.runtime.assemble import make_runner
from services.worker.runtime.model_runner import ModelRunner
from services.worker.sampler import Sampler, torch_argmax
from services.worker.sampling_state import SamplingState
from services.worker.scheduler import Scheduler, SchedulerLimits
from services.worker.tp.channel import StepChannel
from services.worker.tp.parallel import TensorParallel
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from shared.quant_config import with_flag

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda asked for, but torch sees no CUDA device")
    return torch.device(name)


def resolve_dtype(name: str, model: ModelConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return _DTYPES.get(model.torch_dtype, torch.bfloat16) if model.torch_dtype != "float32" else torch.bfloat16


def kv_capacity(cfg: WorkerConfig, layout: KVLayout, device: torch.device) -> int:
    """Token slots for the pool: as configured, or what the free device memory holds."""
    if cfg.max_total_token_num:
        return cfg.max_total_token_num
    if device.type != "cuda":
        return cfg.cpu_kv_tokens
    free, total = torch.cuda.mem_get_info(device)
    budget = free - (1.0 - cfg.mem_fraction) * total
    tokens = int(budget // layout.bytes_per_token)
    if tokens < 1024:
        raise RuntimeError(
            f"only {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB after loading the weights: "
            f"no room for a KV pool at mem_fraction {cfg.mem_fraction}"
        )
    return tokens


@dataclass
class ModelStack:
    """What every rank of a worker group holds: its shard of the model, its KV pool (its share
    of the KV heads), the request-to-token table and the runner (with CUDA graphs)."""

    model_cfg: ModelConfig
    model: CausalLM
    cache: KVCache
    table: ReqTable
    runner: ModelRunner
    max_total_len: int
    device: torch.device


def build_model_stack(
    cfg: WorkerConfig,
    tp: TensorParallel,
    weights: ModelWeights | None = None,
    model_cfg: ModelConfig | None = None,
    channel: StepChannel | None = None,
) -> ModelStack:
    model_cfg = model_cfg or ModelConfig.from_dir(cfg.model_dir)
    model_cfg = replace(model_cfg, quantization=with_flag(model_cfg.quantization, cfg.quantization))
    if model_cfg.vision is not None and tp.size > 1:
        # each step's images' rows would have to reach the other ranks too (tp/channel.py)
        raise ValueError("a vision-language model runs on one rank per group for now (--tp 1)")
    family = family_of(model_cfg)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, model_cfg, device)
    if weights is None and cfg.random_weights:
        log.warning("random weights (benchmark mode): outputs are meaningless")
        weights = family.random(model_cfg, dtype, device, 0, tp)
        if cfg.quantization == "fp8":
            quantize_layers_(weights.layers)
    if weights is None:
        weights = load_weights(cfg.model_dir, model_cfg, dtype, device, tp)
    if cfg.fp8_lm_head:
        if not isinstance(weights.layers[0].qkv, (Fp8Weight, Int4Weight)):
            raise ValueError(
                "--fp8-lm-head needs quantized weights: --quantization fp8, or an FP8, AWQ or GPTQ checkpoint"
            )
        quantize_lm_head_(weights)
    max_total_len = min(cfg.max_req_total_len or model_cfg.context_length, model_cfg.context_length)
    cache = _kv_pool(cfg, model_cfg, tp, dtype, device, max_total_len)
    table = ReqTable(cfg.running_max_req_size, max_total_len, device, dummy_slot=cache.dummy_slot)
    cos_sin = cos_sin_table(model_cfg.head_dim, model_cfg.rope_theta, model_cfg.rope_scaling, max_total_len, device)
    heads, layers = model_cfg.num_heads // tp.size, attention_layers(model_cfg)
    if device.type == "cuda":
        # imported here: the kernels compile for the device they first see
        from services.worker.kernels.triton_ops import TritonOps
        from services.worker.models.attention.triton_backend import TritonAttention

        attn = TritonAttention(
            cache, heads, model_cfg.head_dim, max_decode_batch=cfg.running_max_req_size, layers=layers
        )
        # e4m3 rows beside the norms' outputs: only where Triton converts e4m3 (compute capability
        # 8.9 on); an older GPU's FP8 products dequantize the weights instead
        fp8 = isinstance(weights.layers[0].qkv, Fp8Weight) and fp8_triton(device)
        model = family.model(model_cfg, weights, TritonOps(fp8_rows=fp8), attn, cos_sin, tp)
    else:
        attn = TorchAttention(cache, heads, model_cfg.head_dim, layers)
        model = family.model(model_cfg, weights, TorchOps(), attn, cos_sin, tp)
    runner = make_runner(cfg, model, table, cache.dummy_slot, max_total_len, device, tp.size, channel)
    return ModelStack(model_cfg, model, cache, table, runner, max_total_len, device)


def _kv_pool(
    cfg: WorkerConfig,
    model_cfg: ModelConfig,
    tp: TensorParallel,
    dtype: torch.dtype,
    device: torch.device,
    max_total_len: int,
) -> KVCache:
    layout = KVLayout(
        num_layers=model_cfg.num_layers,
        kv_heads=model_cfg.num_kv_heads // tp.size,
        head_dim=model_cfg.head_dim,
        dtype=dtype,
        quantized=cfg.kv_dtype != "auto",
        quant_dtype=KV_QUANT_DTYPES.get(cfg.kv_dtype, torch.int8),
    )
    # every rank holds the same token slots (its share of the heads of each): the smallest pool wins
    capacity = tp.agree_min(kv_capacity(cfg, layout, device), device)
    log.info(
        "KV pool: %d tokens (%.2f GiB, %s), device %s, weights %s, max request length %d, rank %d of %d",
        capacity,
        capacity * layout.bytes_per_token / 2**30,
        cfg.kv_dtype if layout.quantized else str(dtype).removeprefix("torch."),
        device,
        str(dtype).removeprefix("torch."),
        max_total_len,
        tp.rank,
        tp.size,
    )
    return KVCache(layout, capacity, device)


def build_engine(
    cfg: WorkerConfig,
    tp: TensorParallel | None = None,
    weights: ModelWeights | None = None,
    model_cfg: ModelConfig | None = None,
    channel: StepChannel | None = None,
) -> Engine:
    """Rank 0's engine (the only one with a scheduler and a sampler); channel sends each
    step's batch to the other ranks of a tensor-parallel group."""
    s = build_model_stack(cfg, tp or TensorParallel(), weights, model_cfg, channel)
    allocator = TokenAllocator(s.cache.capacity, s.device)
    prompt_cache = None if cfg.disable_prompt_cache else PromptCache(allocator, s.table)
    if prompt_cache is not None and channel is not None:
        s.table.mirror = []  # the other ranks repeat the cache's writes into rows (channel.py)
        channel.table = s.table
    kv = KVManager(allocator, s.table, prompt_cache)
    eos = frozenset(s.model_cfg.eos_token_ids)
    limits = SchedulerLimits(
        max_running=cfg.running_max_req_size,
        prefill_budget=cfg.batch_max_tokens,
        max_total_len=s.max_total_len,
    )
    state = SamplingState(s.table.max_rows + 1, s.model_cfg.vocab_size, s.device)
    grammars = Grammars(cfg.tokenizer or cfg.model_dir, s.model_cfg.vocab_size, eos)
    sampler = Sampler(state, eos, _argmax(s.device))
    return Engine(s.runner, kv, Scheduler(kv, limits, eos), sampler, s.device, grammars)


def _argmax(device: torch.device):
    """The sampler's argmax: on CUDA the kernel that splits each row over the SMs (PyTorch's
    reduces a row in one block: 27.5 µs for one row of 128k logits on an H200)."""
    if device.type != "cuda":
        return torch_argmax
    from services.worker.kernels.argmax import argmax_rows  # imported here, as the other kernels

    return partial(argmax_rows, num_sms=torch.cuda.get_device_properties(device).multi_processor_count)
