"""Frozen configuration of each service, built once in its ``__main__`` and passed down.

Every field is also a command-line flag (``--field-name``) and an environment variable
(``LS_FIELD_NAME``), see shared/cli.py; a field declared with ``option()`` carries its help
text (and any other flag spellings) with it, into ``--help``. Invariants are checked in ``__post_init__`` so a
bad setting stops the service at start with a message naming it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    pass


# how the router picks among the groups that can take a request (services/router/routing.py)
ROUTING_POLICIES = ("cache_aware", "least_loaded", "round_robin")
# how the front end reads tool calls and thinking out of a chat answer (services/tokenizer/openai/)
TOOL_CALL_PARSERS = ("hermes", "llama3_json")
REASONING_PARSERS = ("deepseek_r1", "qwen3")


def option(default: Any, help: str, *aliases: str, positional: str = "") -> Any:
    """A config field with its help text and other flag spellings (``--tensor-parallel-size``
    beside ``--tp``); ``positional``: its name as the command's optional positional argument too."""
    meta = {"help": help, "aliases": aliases, "positional": positional}
    return dataclasses.field(default=default, metadata=meta)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class CommonConfig:
    """What every service takes."""

    redis_url: str = option(
        "redis://127.0.0.1:6379/0",
        "the Redis every service of the stack shares; with --redis-sentinel only its database, user and password count",
    )
    redis_sentinel: str = option(
        "",
        "Redis Sentinel addresses, host:port comma-separated: the master named --redis-master-name is found through "
        "them and followed to its successor after a failover; none: --redis-url's host",
    )
    redis_master_name: str = option("mymaster", "with --redis-sentinel: the master's name (sentinel monitor NAME ...)")
    redis_sentinel_password: str = option("", "with --redis-sentinel: the sentinels' own password; none: they ask none")
    namespace: str = option("ls", "key prefix, so stacks can share one Redis")
    replica: str = option("", "this replica's name; none: derived from host name and pid")
    log_level: str = option("INFO", "DEBUG, INFO, WARNING or ERROR")
    log_format: str = option("text", "text (one line per event) or json (one JSON object per line)")
    model_name: str = option(
        "", "the model's name: in the API (the front end) and on every metrics series; none: the model directory's name"
    )
    stream_maxlen: int = option(100_000, "XADD MAXLEN ~ for every stream this service writes")
    metrics_port: int = option(0, "Prometheus /metrics on this port; 0: none (the front end serves its own)")
    busy_poll_ms: float = option(
        -1.0,
        "poll Redis instead of a blocking read while requests are in flight and this long after the last one "
        "(shared/busy_poll.py); 0: never; below 0: 200 on a host with 8 CPUs or more, else never",
    )

    def __post_init__(self) -> None:
        _check(self.log_format in ("text", "json"), f"log_format must be text or json, got {self.log_format!r}")
        _check(not self.redis_sentinel or bool(self.redis_master_name), "redis_master_name is required with sentinels")
        self.sentinel_addresses  # noqa: B018 (parsed here so that a bad address stops the service at start)

    @property
    def sentinel_addresses(self) -> tuple[tuple[str, int], ...]:
        """--redis-sentinel as (host, port) pairs; an IPv6 host in brackets ([::1]:26379)."""
        out = []
        for item in (x.strip() for x in self.redis_sentinel.split(",")):
            if not item:
                continue
            host, _, port = item.rpartition(":")
            host = host.removeprefix("[").removesuffix("]")
            _check(bool(host) and port.isdigit() and 0 < int(port) < 65536, f"redis_sentinel: bad address {item!r}")
            out.append((host, int(port)))
        return tuple(out)

    def served_model_name(self) -> str:
        """model_name, else the model directory's base name (the router has none: "")."""
        model_dir = str(getattr(self, "model_dir", ""))
        return self.model_name or (os.path.basename(os.path.normpath(model_dir)) if model_dir else "")


@dataclass(frozen=True)
class TokenizerConfig(CommonConfig):
    """The HTTP front end: tokenizes, submits to the router, streams the replies back."""

    model_dir: str = option("", "Hugging Face model directory (required)")
    tokenizer: str = option("", "the tokenizer's directory when it is not the model's")
    chat_template: str = option(
        "", "a Jinja chat template, its file's path or its text, in place of the tokenizer's own"
    )
    tool_call_parser: str = option(
        "",
        f"how tool calls are written in the model's answers ({', '.join(TOOL_CALL_PARSERS)}): chat requests with "
        "tool_choice auto read them out; none: tool_choice auto is refused ('required' and named ones work)",
    )
    reasoning_parser: str = option(
        "",
        f"how the model's thinking is set apart ({', '.join(REASONING_PARSERS)}): it goes to reasoning_content, "
        "and an output format applies to the answer after it; none: all of the output is content",
    )
    host: str = option("0.0.0.0", "address the HTTP API listens on")
    port: int = option(8000, "port of the HTTP API")
    reuse_port: bool = option(
        False,
        "share host:port with other front-end processes of this host (SO_REUSEPORT): the kernel spreads new "
        "connections among them, so one port scales past one Python process",
    )
    max_req_total_len: int = option(0, "most prompt + output tokens of a request; 0: the model's context length")
    max_body_bytes: int = option(
        4 * 1024 * 1024, "largest request body, counted on the bytes read (chunked bodies too): past it, 413"
    )
    body_timeout_s: float = option(30.0, "a request's whole body must arrive within this: past it, 408")
    max_connections: int = option(4096, "open connections (and their requests) served at once; past it, 503")
    header_timeout_s: float = option(10.0, "a connection must send a request's headers within this, or is closed")
    request_timeout_s: float = option(600.0, "no request outlives this, queued or running")
    pipeline_dead_after_s: float = option(
        3.0, "a service whose heartbeat is older than this is dead; Redis unreachable this long fails requests too"
    )
    pipeline_check_s: float = option(
        1.0, "how often the heartbeats are read: who is alive, how full the router's queue is"
    )
    router_dead_after_s: float = option(
        8.0,
        "the router is dead only after this long without a heartbeat (one restarted sooner takes over its queue); "
        "requests not answered yet then end with an error (services/tokenizer/watchdog.py)",
    )
    tokenizer_threads: int = option(2, "threads that tokenize, off the event loop")
    api_keys: tuple[str, ...] = option((), "clients must send 'Authorization: Bearer KEY' (repeatable); none: open")
    api_key_file: str = option(
        "", "a file of keys, one a line, added to api_keys (kept out of the command line, which other users can read)"
    )
    protect_metrics: bool = option(
        False, "/metrics asks for the API key too; false: open (Prometheus scrapers carry none)"
    )
    drain_timeout_s: float = option(
        30.0, "on SIGTERM, requests in flight get this long to finish before they end with an error and it exits"
    )
    fastchat_controller: str = option(
        "", "a FastChat controller to register with as a model worker (docs/fastchat.md); none: no registration"
    )
    worker_address: str = option(
        "",
        "the URL FastChat reaches this front end at; none: http://<host>:<port>, "
        "for 0.0.0.0 this host's address on its route to the controller",
    )
    model_names: str = option("", "names to register with FastChat, comma-separated; none: model_name")
    limit_worker_concurrency: int = option(1024, "FastChat requests served at once; the rest wait, counted as queued")
    fastchat_heartbeat_s: float = option(
        45.0, "FastChat's heartbeat interval (its controller forgets a worker after 90 s)"
    )
    max_images_per_request: int = option(8, "a vision model's request may carry at most this many images")
    max_image_bytes: int = option(
        10 * 1024 * 1024, "largest image file (decoded from base64, or fetched): past it, 413"
    )
    max_image_pixels: int = option(
        4096 * 4096, "largest image, in pixels (width x height), checked before it is decoded: past it, 413"
    )
    allowed_image_domains: tuple[str, ...] = option(
        (),
        "hosts an image_url may be fetched from over http(s) (repeatable; a name allows its subdomains too); "
        "none: only data: URLs and base64 are taken",
    )
    image_fetch_timeout_s: float = option(5.0, "an image fetched over http(s) must arrive within this")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(bool(self.model_dir), "model_dir is required")
        _check(0 < self.port < 65536, f"port must be in 1..65535, got {self.port}")
        _check(all(k and k == k.strip() for k in self.api_keys), "api_keys must be non-empty, without spaces around")
        _check(self.max_req_total_len >= 0, "max_req_total_len must be >= 0")
        _check(self.request_timeout_s > 0, "request_timeout_s must be > 0")
        _check(self.max_body_bytes > 0 and self.body_timeout_s > 0, "max_body_bytes and body_timeout_s must be > 0")
        _check(self.max_connections >= 1 and self.header_timeout_s > 0, "max_connections, header_timeout_s must be > 0")
        _check(self.pipeline_check_s > 0, "pipeline_check_s must be > 0")
        _check(self.router_dead_after_s > 0, "router_dead_after_s must be > 0")
        _check(self.tokenizer_threads >= 1, "tokenizer_threads must be >= 1")
        _check(
            self.tool_call_parser in ("", *TOOL_CALL_PARSERS),
            f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {self.tool_call_parser!r}",
        )
        _check(
            self.reasoning_parser in ("", *REASONING_PARSERS),
            f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}",
        )
        _check(self.drain_timeout_s >= 0, "drain_timeout_s must be >= 0")
        for name in ("fastchat_controller", "worker_address"):
            url = getattr(self, name)
            _check(not url or url.startswith(("http://", "https://")), f"{name} must be an http(s) URL, got {url!r}")
        # FastChat's controller and API server call the worker routes without a key
        _check(
            not (self.fastchat_controller and self.api_keys),
            "fastchat_controller cannot be used with api_keys: FastChat calls its workers without a key",
        )
        _check(
            not self.model_names or all(n.strip() for n in self.model_names.split(",")),
            f"model_names must be comma-separated non-empty names, got {self.model_names!r}",
        )
        _check(self.limit_worker_concurrency >= 1, "limit_worker_concurrency must be >= 1")
        _check(self.fastchat_heartbeat_s > 0, "fastchat_heartbeat_s must be > 0")
        _check(self.max_images_per_request >= 1, "max_images_per_request must be >= 1")
        _check(
            self.max_image_bytes > 0 and self.max_image_pixels > 0, "max_image_bytes and max_image_pixels must be > 0"
        )
        _check(self.image_fetch_timeout_s > 0, "image_fetch_timeout_s must be > 0")
        _check(
            all(d and "/" not in d and d == d.strip().lower() for d in self.allowed_image_domains),
            f"allowed_image_domains must be lower-case host names, got {self.allowed_image_domains}",
        )


@dataclass(frozen=True)
class RouterConfig(CommonConfig):
    """The router: the global queue and admission onto worker groups."""

    router_token_ratio: float = option(
        0.0,
        "LightLLM's admission knob: a pool whose KV usage is at or above this is busy and every request counts at "
        "its full max_new_tokens (0.0: always); below it a request without ignore_eos counts at a guess",
    )
    router_max_new_token_len: int = option(1024, "the guess of a request's output length when not busy")
    running_max_req_size: int = option(1000, "most requests placed on one worker group at once (and its own cap)")
    batch_max_tokens: int = option(0, "most prefill tokens placed on a group and not started yet; 0: no limit")
    worker_dead_after_s: float = option(3.0, "a group with no status for this long is dead")
    max_waiting: int = option(10_000, "waiting-queue bound; past it requests are rejected (overloaded, 503)")
    max_queue_time_s: float = option(0.0, "a request still queued this long after arrival ends (deadline); 0: none")
    status_log_every_s: float = option(10.0, "seconds between the router's status log lines")
    routing_policy: str = option(
        "cache_aware",
        "the group a request goes to: cache_aware (its longest prefix match), least_loaded or round_robin",
    )
    cache_aware_balance_margin: int = option(
        64, "cache_aware: past this many requests more than the least loaded group (and -rel), a request goes by load"
    )
    cache_aware_balance_rel: float = option(
        1.5, "cache_aware: ... and past this many times as many (SGLang's balance_abs and _rel_threshold)"
    )
    cache_aware_min_match: float = option(
        0.3, "cache_aware: a prefix match counts when longer, by this fraction of the prompt, than least_loaded's"
    )
    cache_aware_max_overtake: int = option(
        256, "cache_aware: a lane's waiting request is overtaken at most this often by ones whose prefix runs there"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            self.routing_policy in ROUTING_POLICIES,
            f"routing_policy must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing_policy!r}",
        )
        _check(
            min(self.cache_aware_balance_margin, self.cache_aware_max_overtake) >= 0, "cache_aware counts must be >= 0"
        )
        _check(self.cache_aware_balance_rel >= 1.0, "cache_aware_balance_rel must be >= 1.0")
        _check(0.0 <= self.cache_aware_min_match <= 1.0, "cache_aware_min_match must be in [0, 1]")
        _check(0.0 <= self.router_token_ratio <= 1.0, "router_token_ratio must be in [0, 1]")
        _check(self.router_max_new_token_len >= 1, "router_max_new_token_len must be >= 1")
        _check(self.running_max_req_size >= 1, "running_max_req_size must be >= 1")
        _check(self.batch_max_tokens >= 0, "batch_max_tokens must be >= 0")
        _check(self.worker_dead_after_s > 0, "worker_dead_after_s must be > 0")
        _check(self.max_waiting >= 1, "max_waiting must be >= 1")
        _check(self.max_queue_time_s >= 0, "max_queue_time_s must be >= 0")
        _check(self.status_log_every_s > 0, "status_log_every_s must be > 0")


@dataclass(frozen=True)
class WorkerConfig(CommonConfig):
    """A worker group: the model, its KV pool and the step loop."""

    model_dir: str = option("", "Hugging Face model directory (required)")
    tokenizer: str = option("", "the tokenizer's directory when it is not the model's (structured output reads it)")
    group: str = option("0", "this worker group's name; the router places requests by it; auto: the replica's name")
    device: str = option("auto", "auto, cpu or cuda")
    dtype: str = option("auto", "auto (the model's, float32 on the CPU), float32, bfloat16 or float16")
    kv_dtype: str = option(
        "auto", "KV cache: auto (the model dtype), int8 or fp8 (e4m3; each with per-token, per-head scales)"
    )
    quantization: str = option(
        "none",
        "weights: none (as the checkpoint stores them) or fp8 (a bf16 checkpoint's projections quantized to e4m3 "
        "with per-channel scales at load; an FP8 checkpoint is read as FP8 either way)",
    )
    fp8_lm_head: bool = option(False, "the output layer in FP8 too, beside FP8, AWQ or GPTQ weights (tied: a copy)")
    max_total_token_num: int = option(0, "KV pool tokens; 0: sized from free memory")
    mem_fraction: float = option(0.9, "share of the device memory for weights plus KV pool")
    cpu_kv_tokens: int = option(32_768, "KV pool tokens on the CPU when max_total_token_num is 0")
    batch_max_tokens: int = option(8192, "prefill tokens per step (longer prompts go in chunks)")
    running_max_req_size: int = option(256, "most requests running at once")
    max_req_total_len: int = option(0, "most prompt + output tokens of a request; 0: the model's context length")
    status_interval_s: float = option(0.5, "seconds between statuses to the router")
    cuda_graph_max_bs: int = option(512, "decode batches up to this size replay CUDA graphs; 0: none")
    cuda_graph_max_tokens: int = option(
        2048,
        "steps with prompt tokens, up to this many tokens in all, replay CUDA graphs of everything but attention "
        "(one-GPU groups only, for now); 0: none",
    )
    gemm_search: bool = option(
        True,
        "decode graphs: time cuBLASLt's algorithms beside PyTorch's matmul for each projection and bucket and "
        "capture the fastest (services/worker/blas_choice.py); false: PyTorch's libraries only",
    )
    fold_norms: bool = option(
        True,
        "on CUDA, one GPU, a float KV pool and no QKV bias: fold each layer's norm weights into its QKV and gate|up "
        "weights (services/worker/models/fold.py); false: as loaded",
    )
    random_weights: bool = option(False, "draw weights from a seed on the device (benchmarks: no checkpoint needed)")
    warmup: bool = option(True, "on CUDA, run a few prompts before serving so no request waits for a compile")
    tp: int = option(1, "tensor-parallel ranks of this group: one process per GPU (gloo on the CPU)")
    nnodes: int = option(1, "hosts this group's --tp ranks are spread over, tp/nnodes ranks on each")
    node_rank: int = option(
        0,
        "this host's place in a group over several hosts: 0 holds rank 0, which alone talks to Redis; "
        "node k holds ranks k*tp/nnodes onwards and only runs them",
    )
    dist_init_addr: str = option(
        "",
        "with --nnodes above 1: host:port of node 0 that every host reaches; torch.distributed meets there, "
        "and each step's batch goes out to the other hosts' ranks from port+1",
    )
    disable_prompt_cache: bool = option(
        False,
        "recompute every prompt from its first token: no radix tree of finished and running requests' tokens over "
        "the KV pool (services/worker/memory/prompt_cache.py)",
        "--disable_dynamic_prompt_cache",
    )
    drain_timeout_s: float = option(
        30.0,
        "on SIGTERM the group takes no new requests and those it holds get this long to finish; what is left "
        "then goes on on another group (handed over); a second signal ends the wait",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(bool(self.model_dir), "model_dir is required")
        _check(self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {self.device}")
        _check(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype}",
        )
        _check(self.kv_dtype in ("auto", "int8", "fp8"), f"kv_dtype must be auto, int8 or fp8, got {self.kv_dtype}")
        _check(self.quantization in ("none", "fp8"), f"quantization must be none or fp8, got {self.quantization}")
        _check(self.max_total_token_num >= 0, "max_total_token_num must be >= 0")
        _check(0.0 < self.mem_fraction <= 1.0, "mem_fraction must be in (0, 1]")
        _check(self.batch_max_tokens >= 16, "batch_max_tokens must be >= 16")
        _check(self.running_max_req_size >= 1, "running_max_req_size must be >= 1")
        _check(self.status_interval_s > 0, "status_interval_s must be > 0")
        _check(self.cuda_graph_max_bs >= 0, "cuda_graph_max_bs must be >= 0")
        _check(self.cuda_graph_max_tokens >= 0, "cuda_graph_max_tokens must be >= 0")
        _check(self.tp >= 1, f"tp must be >= 1, got {self.tp}")
        _check(self.nnodes >= 1 and self.tp % self.nnodes == 0, f"nnodes must divide tp ({self.tp}), got {self.nnodes}")
        _check(0 <= self.node_rank < self.nnodes, f"node_rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        _check(self.nnodes == 1 or bool(self.dist_init_addr), "dist_init_addr is required with nnodes > 1")
        _check(self.drain_timeout_s >= 0, "drain_timeout_s must be >= 0")
        if self.dist_init_addr:
            self.dist_address  # noqa: B018 (parsed here so that a bad address stops the service at start)

    @property
    def dist_address(self) -> tuple[str, int]:
        """--dist-init-addr as (host, port); an IPv6 host in brackets."""
        host, _, port = self.dist_init_addr.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        _check(bool(host) and port.isdigit() and 0 < int(port) < 65535, f"dist_init_addr: bad {self.dist_init_addr!r}")
        return host, int(port)

    @property
    def ranks_here(self) -> range:
        """The tensor-parallel ranks this host runs."""
        per = self.tp // self.nnodes
        return range(self.node_rank * per, (self.node_rank + 1) * per)


@dataclass(frozen=True)
class DetokenizerConfig(CommonConfig):
    """A detokenizer shard: token ids to text, stop strings."""

    model_dir: str = option("", "Hugging Face model directory (required)")
    tokenizer: str = option("", "the tokenizer's directory when it is not the model's")
    drain_timeout_s: float = option(
        30.0,
        "on SIGTERM front ends stop choosing this shard and the requests it holds get this long to end; what is "
        "left then is taken over by another shard (or this one restarted); a second signal ends the wait",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(bool(self.model_dir), "model_dir is required")
        _check(self.drain_timeout_s >= 0, "drain_timeout_s must be >= 0")
