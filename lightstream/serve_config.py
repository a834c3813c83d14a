"""``lightstream serve``'s settings: each field is a flag (in LightLLM's and vLLM's spelling where
they differ), an ``LS_*`` variable and a help text, declared once here (shared/cli.py reads
them); ``service_args`` hands each on to the services' own flags (shared/config.py)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.config import REASONING_PARSERS, ROUTING_POLICIES, TOOL_CALL_PARSERS, ConfigError, option

# what --dtype accepts -> the worker's spelling
DTYPES = {
    "auto": "auto",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}
KV_DTYPES = ("auto", "int8", "fp8")
QUANTIZATIONS = ("none", "fp8")


@dataclass(frozen=True)
class ServeConfig:
    model_dir: str = option(
        "",
        "Hugging Face model directory (config.json, safetensors, tokenizer); none: the tiny demo model on the CPU",
        "--model",
        positional="MODEL",
    )
    host: str = option("0.0.0.0", "address the HTTP API listens on")
    port: int = option(8000, "port of the HTTP API")
    model_name: str = option("", "the model's name in the API; none: the model directory's name", "--served-model-name")
    tokenizer: str = option("", "the tokenizer's directory when it is not the model's")
    chat_template: str = option("", "a Jinja chat template (its file's path or its text) in place of the model's")
    tool_call_parser: str = option(
        "", f"how the model writes tool calls ({', '.join(TOOL_CALL_PARSERS)}); none: tool_choice auto is refused"
    )
    reasoning_parser: str = option(
        "", f"how the model's thinking is set apart ({', '.join(REASONING_PARSERS)}): to message.reasoning_content"
    )
    api_keys: tuple[str, ...] = option(
        (), "clients must send 'Authorization: Bearer KEY' (repeatable; LS_API_KEYS or --api-key-file keep it private)"
    )
    api_key_file: str = option("", "a file of keys, one a line, added to --api-key's (kept out of the command line)")
    drain_timeout_s: float = option(
        30.0,
        "on SIGTERM or Ctrl-C, the requests in flight get this long to finish before they end with an error and "
        "everything stops; 0: at once",
    )
    tp: int = option(
        1, "tensor-parallel ranks per worker group, one process per GPU (gloo on the CPU)", "--tensor-parallel-size"
    )
    dp: int = option(
        1, "worker groups (data parallelism), each with its own KV pool", "--data-parallel-size", "--workers"
    )
    dtype: str = option("auto", f"weights and activations: {', '.join(DTYPES)}; auto: the model's (float32 on the CPU)")
    kv_dtype: str = option(
        "auto", "KV cache: auto (the model dtype), int8 or fp8 (e4m3), per-token per-head scales", "--kv-cache-dtype"
    )
    quantization: str = option(
        "none",
        "weights: none (as stored: bf16, or an FP8, AWQ or GPTQ checkpoint) or fp8 (a bf16 checkpoint's projections "
        "quantized to e4m3 with per-channel scales at load)",
        "-q",
    )
    fp8_lm_head: bool = option(
        False, "with FP8, AWQ or GPTQ weights: the output layer (lm_head) in FP8 too; else it stays bf16"
    )
    mem_fraction: float = option(0.9, "share of GPU memory for weights plus KV cache", "--gpu-memory-utilization")
    max_total_token_num: int = option(
        0, "tokens in each group's KV pool; 0: sized from free memory", "--max-total-tokens"
    )
    max_req_total_len: int = option(
        0, "most prompt + output tokens of a request; 0: the model's context length", "--max-model-len"
    )
    running_max_req_size: int = option(256, "most requests running at once in a worker group", "--max-num-seqs")
    chunked_prefill_size: int = option(8192, "most prompt tokens one step prefills (longer prompts go in chunks)")
    disable_prompt_cache: bool = option(
        False,
        "recompute every prompt from its first token (no prefix reuse across requests)",
        "--disable_dynamic_prompt_cache",
        "--no-enable-prefix-caching",
    )
    routing_policy: str = option(
        "cache_aware",
        "how the router picks a data-parallel group: cache_aware (the longest cached prefix, unless that group is "
        "much busier), least_loaded or round_robin",
    )
    log_format: str = option("text", "every service's log: text (one line per event) or json (one object per line)")
    log_dir: str = option("", "write each service's log to DIR/<service>.log; none: this terminal")
    detokenizers: int = option(1, "detokenizer processes")
    visuals: int = option(1, "visual processes (a vision-language model's image encoders; none for a text model)")
    fronts: int = option(1, "HTTP front-end processes sharing --port (SO_REUSEPORT)")
    worker_args: tuple[str, ...] = option((), "extra flag for each worker, e.g. --worker-arg=--cuda-graph-max-bs=64")
    router_args: tuple[str, ...] = option((), "extra flag for the router (repeatable)")
    tokenizer_args: tuple[str, ...] = option((), "extra flag for each HTTP front end (repeatable)")
    detokenizer_args: tuple[str, ...] = option((), "extra flag for each detokenizer (repeatable)")
    visual_args: tuple[str, ...] = option((), "extra flag for each visual process (repeatable)")

    def __post_init__(self) -> None:
        _check(0 < self.port < 65536, f"--port must be in 1..65535, got {self.port}")
        _check(self.tp >= 1 and self.dp >= 1, f"--tp and --dp must be >= 1, got {self.tp} and {self.dp}")
        _check(self.dtype in DTYPES, f"--dtype {self.dtype!r} is not supported; supported: {', '.join(DTYPES)}")
        _check(
            self.kv_dtype in KV_DTYPES,
            f"--kv-cache-dtype {self.kv_dtype!r} is not supported; supported: {', '.join(KV_DTYPES)}",
        )
        _check(
            self.quantization in QUANTIZATIONS,
            f"--quantization {self.quantization!r} is not supported; supported: {', '.join(QUANTIZATIONS)}",
        )
        _check(0.0 < self.mem_fraction <= 1.0, f"--mem-fraction must be in (0, 1], got {self.mem_fraction}")
        _check(self.max_total_token_num >= 0, "--max-total-token-num must be >= 0")
        _check(self.max_req_total_len >= 0, "--max-model-len must be >= 0")
        _check(self.running_max_req_size >= 1, "--max-num-seqs must be >= 1")
        _check(self.chunked_prefill_size >= 16, "--chunked-prefill-size must be >= 16")
        _check(self.detokenizers >= 1 and self.fronts >= 1, "--detokenizers and --fronts must be >= 1")
        _check(self.visuals >= 1, "--visuals must be >= 1")
        _check(self.drain_timeout_s >= 0, f"--drain-timeout-s must be >= 0, got {self.drain_timeout_s}")
        _check(self.log_format in ("text", "json"), f"--log-format must be text or json, got {self.log_format!r}")
        _check(
            self.tool_call_parser in ("", *TOOL_CALL_PARSERS),
            f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}",
        )
        _check(
            self.reasoning_parser in ("", *REASONING_PARSERS),
            f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}",
        )
        _check(
            self.routing_policy in ROUTING_POLICIES,
            f"--routing-policy must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing_policy!r}",
        )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


# serve's field -> (the services that take it, their flag); a value left at its default is not
# passed, so a service keeps its own default or its own LS_* variable
SERVICE_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "tp": (("worker",), "--tp"),
    "dtype": (("worker", "visual"), "--dtype"),
    "kv_dtype": (("worker",), "--kv-dtype"),
    "quantization": (("worker",), "--quantization"),
    "fp8_lm_head": (("worker",), "--fp8-lm-head"),
    "mem_fraction": (("worker",), "--mem-fraction"),
    "max_total_token_num": (("worker",), "--max-total-token-num"),
    "max_req_total_len": (("worker", "tokenizer"), "--max-req-total-len"),
    "running_max_req_size": (("worker", "router"), "--running-max-req-size"),
    "chunked_prefill_size": (("worker",), "--batch-max-tokens"),
    "disable_prompt_cache": (("worker",), "--disable-prompt-cache"),
    "routing_policy": (("router",), "--routing-policy"),
    "drain_timeout_s": (("worker", "tokenizer", "detokenizer"), "--drain-timeout-s"),
    "log_format": (("worker", "router", "tokenizer", "detokenizer", "visual"), "--log-format"),
    "model_name": (("tokenizer", "worker", "router", "detokenizer", "visual"), "--model-name"),
    "tokenizer": (("tokenizer", "detokenizer", "worker"), "--tokenizer"),
    "chat_template": (("tokenizer",), "--chat-template"),
    "tool_call_parser": (("tokenizer",), "--tool-call-parser"),
    "reasoning_parser": (("tokenizer",), "--reasoning-parser"),
}


def service_args(cfg: ServeConfig) -> dict[str, list[str]]:
    """Each service's own flags for these settings (the pass-through flags last, so they win).
    The API keys are not among them: they go in the front ends' environment (front_env)."""
    args: dict[str, list[str]] = {"worker": [], "router": [], "tokenizer": [], "detokenizer": [], "visual": []}
    defaults = ServeConfig()
    for name, (services, flag) in SERVICE_FLAGS.items():
        value = getattr(cfg, name)
        if value != getattr(defaults, name):
            for service in services:
                args[service] += [flag, DTYPES[value] if name == "dtype" else str(value)]
    args["worker"] += cfg.worker_args
    args["router"] += cfg.router_args
    args["tokenizer"] += cfg.tokenizer_args
    args["detokenizer"] += cfg.detokenizer_args
    args["visual"] += cfg.visual_args
    return args


def front_env(cfg: ServeConfig) -> dict[str, str]:
    """The front ends' environment for these settings: the API keys, which their command lines
    would show to every user of the host (/proc/<pid>/cmdline; the environment is the owner's)."""
    return {"LS_API_KEYS": ",".join(cfg.api_keys)} if cfg.api_keys else {}
