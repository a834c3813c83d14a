"""The engines of one tools/benchmark_engine.py run: built from its flags, once per prompt-cache
setting and again wherever a part must start from an empty prompt cache.

Random weights are drawn once and shared by every build (folding the norms into them again is
a multiply by ones); a build with --quantization fp8, awq or gptq quantizes their projections in
place (awq, gptq: int4 of group size 128, as models/int4_formats.py writes a checkpoint), so every
build after it has those weights too (tools/bench_quant.py builds the bf16 ones first).
Every build after the first gets the first one's KV pool size, so the settings compared in one
run hold the same number of tokens (bench_quant.py resets it: each variant sizes its own). An
engine is released before the next is built: its KV pool and CUDA graphs go back to the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.worker.build import build_engine
from services.worker.engine import Engine
from services.worker.models import int4_formats
from services.worker.models.bench_shapes import SHAPES
from services.worker.models.fp8_weight import Fp8Weight, quantize_layers_
from services.worker.models.int4_weight import Int4Weight
from services.worker.models.registry import random_weights
from services.worker.models.weights import ModelWeights
from services.worker.runtime.warmup import warm_up
from services.worker.tp.group import leave_group, start_group
from shared.config import WorkerConfig
from shared.model_config import ModelConfig

INT4 = ("awq", "gptq")  # --quantization's int4 methods: random weights only (a checkpoint says its own)


@dataclass
class Built:
    engine: Engine  # rank 0's
    model_cfg: ModelConfig
    stop: Callable[[], None]  # stops the group's other ranks
    info: dict  # build_s, kv_capacity_tokens, prompt_cache, ...


class EngineFactory:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.weights: ModelWeights | None = None
        self.capacity = args.max_total_token_num  # 0 until the first build has sized its pool

    def config(self, cache_on: bool) -> WorkerConfig:
        a = self.args
        return WorkerConfig(
            model_dir=a.model_dir or "(random weights)",
            device=a.device,
            dtype=a.dtype,
            kv_dtype=a.kv_dtype,
            quantization="fp8" if a.quantization == "fp8" else "none",  # int4: the weights say so
            fp8_lm_head=a.fp8_lm_head,
            max_total_token_num=self.capacity,
            mem_fraction=a.mem_fraction,
            batch_max_tokens=a.batch_max_tokens,
            running_max_req_size=a.running_max_req_size,
            cuda_graph_max_bs=a.cuda_graph_max_bs,
            cuda_graph_max_tokens=a.cuda_graph_max_tokens,
            gemm_search=bool(a.gemm_search),
            fold_norms=bool(a.fold_norms),
            tp=a.tp,
            disable_prompt_cache=not cache_on,
        )

    def build(self, cache_on: bool) -> Built:
        """An engine with the prompt cache on or off, warmed up as the worker service warms it."""
        t = time.perf_counter()
        engine, model_cfg, stop = self._engine(self.config(cache_on))
        if not self.args.decode_inputs:
            engine.runner.staging = None
        self.capacity = self.capacity or engine.kv.capacity
        info = {
            "prompt_cache": "on" if cache_on else "off",
            "build_s": time.perf_counter() - t,
            "kv_capacity_tokens": engine.kv.capacity,
            "shape": self.args.model_dir or self.args.shape,
            "gemm_search": bool(self.args.gemm_search),
            "fold_norms": engine.runner.step.folded,
            "decode_inputs": engine.runner.staging is not None,
        }
        if engine.device.type == "cuda":  # as the worker service does before it serves
            info["warmup_s"] = warm_up(engine, model_cfg.vocab_size).seconds
        return Built(engine, model_cfg, stop, info)

    def release(self, built: Built) -> None:
        built.stop()
        device = built.engine.device
        built.engine = None  # type: ignore[assignment]  # the last reference: its pool and graphs go
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()

    def _engine(self, cfg: WorkerConfig) -> tuple[Engine, ModelConfig, Callable[[], None]]:
        a = self.args
        if a.tp > 1:
            return _tp_engine(a, cfg)
        if a.model_dir:
            return build_engine(cfg), ModelConfig.from_dir(a.model_dir), lambda: None
        model_cfg = ModelConfig.from_dict(SHAPES[a.shape])
        if self.weights is None:
            device = torch.device(a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            self.weights = random_weights(model_cfg, dtype, device, seed=0)
        if a.quantization == "fp8":
            quantize_layers_(self.weights.layers)  # the bf16 tensors go: their memory joins the KV pool
        elif a.quantization in INT4:
            int4_formats.quantize_layers_(self.weights.layers, a.quantization)
        return build_engine(cfg, weights=self.weights, model_cfg=model_cfg), model_cfg, lambda: None


def projection_bytes(w: object) -> float:
    """Bytes a weight of a projection stored as w: FP8 1 (its scales, one float32 a row, left
    out); int4 a half plus each group's bf16 scale and uint8 zero point; 0: the model's dtype."""
    if isinstance(w, Int4Weight):
        return 0.5 + 3 / w.group_size
    return 1 if isinstance(w, Fp8Weight) else 0


def _tp_engine(args: argparse.Namespace, cfg: WorkerConfig) -> tuple[Engine, ModelConfig, Callable[[], None]]:
    """Rank 0 here, ranks 1..tp-1 as child processes: the worker service's own start-up."""
    if not args.model_dir:
        # the other ranks read the shape from a model directory: a config.json is all they need
        model_dir = tempfile.mkdtemp(prefix="lightstream-shape-")
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(SHAPES[args.shape], f)
        cfg = dataclasses.replace(cfg, model_dir=model_dir, random_weights=True)
    group = start_group(cfg)
    engine = build_engine(cfg, group.tp, channel=group.channel)

    def stop() -> None:
        group.stop(join_s=30)
        leave_group()

    return engine, ModelConfig.from_dir(cfg.model_dir), stop
