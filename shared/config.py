"""Frozen configuration of each service, built once in its ``__main__`` and passed down.

Every field is also a command-line flag (``--field-name``) and an environment variable
(``LS_FIELD_NAME``), see shared/cli.py. Invariants are checked in ``__post_init__`` so a
bad setting stops the service at start with a message naming it.
"""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    pass


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class CommonConfig:
    redis_url: str = "redis://127.0.0.1:6379/0"
    namespace: str = "ls"
    replica: str = ""  # this replica's name; empty: derived from host name and pid
    log_level: str = "INFO"
    stream_maxlen: int = 100_000  # XADD MAXLEN ~ for every stream this service writes
    metrics_port: int = 0  # Prometheus /metrics on this port; 0: none (the tokenizer serves its own)
    # poll Redis instead of sleeping in a blocking read while requests are in flight and this
    # long after the last one (shared/busy_poll.py); 0: never; below 0: 200 on a host with 8
    # CPUs or more, else never
    busy_poll_ms: float = -1.0


@dataclass(frozen=True)
class TokenizerConfig(CommonConfig):
    model_dir: str = ""
    model_name: str = ""  # the name clients use; empty: the model directory's base name
    host: str = "0.0.0.0"
    port: int = 8000
    # share host:port with other front-end processes of this host (SO_REUSEPORT); the kernel
    # spreads new connections among them, so one port scales past one Python process
    reuse_port: bool = False
    max_req_total_len: int = 0  # prompt + output tokens; 0: the model's context length
    max_body_bytes: int = 4 * 1024 * 1024
    request_timeout_s: float = 600.0  # no request outlives this, queued or running
    pipeline_dead_after_s: float = 3.0  # a service whose heartbeat is older than this is dead
    pipeline_check_s: float = 1.0  # how often the heartbeats are read: who is alive, how full the router's queue is
    tokenizer_threads: int = 2
    # clients must send one of these as "Authorization: Bearer <key>"; empty: no keys asked
    api_keys: tuple[str, ...] = ()
    protect_metrics: bool = False  # /metrics asks for the API key too; false: open (Prometheus scrapers carry none)
    # on SIGTERM, requests in flight get this long to finish before they end with an error and the process exits
    drain_timeout_s: float = 30.0
    # FastChat (docs/fastchat.md): the controller to register with as a model worker; empty: none
    fastchat_controller: str = ""
    worker_address: str = ""  # the URL FastChat reaches this front end at; empty: http://<host>:<port>
    model_names: str = ""  # names to register, comma-separated as FastChat spells it; empty: model_name
    limit_worker_concurrency: int = 1024  # FastChat requests served at once; the rest wait, counted as queued
    fastchat_heartbeat_s: float = 45.0  # FastChat's heartbeat interval (its controller forgets a worker after 90 s)

    def __post_init__(self) -> None:
        _check(bool(self.model_dir), "model_dir is required")
        _check(0 < self.port < 65536, f"port must be in 1..65535, got {self.port}")
        _check(all(k and k == k.strip() for k in self.api_keys), "api_keys must be non-empty, without spaces around")
        _check(self.max_req_total_len >= 0, "max_req_total_len must be >= 0")
        _check(self.request_timeout_s > 0, "request_timeout_s must be > 0")
        _check(self.pipeline_check_s > 0, "pipeline_check_s must be > 0")
        _check(self.tokenizer_threads >= 1, "tokenizer_threads must be >= 1")
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


@dataclass(frozen=True)
class RouterConfig(CommonConfig):
    # LightLLM's admission knobs: a pool whose KV usage is at or above router_token_ratio is
    # 'busy' and every request is counted at its full max_new_tokens (0.0, the default: always);
    # below it, a request without ignore_eos is counted at a guess of its output length
    router_token_ratio: float = 0.0
    router_max_new_token_len: int = 1024  # the guess for a request's output when not busy
    running_max_req_size: int = 1000  # most requests placed on one worker group at once (also capped by the group's)
    batch_max_tokens: int = 0  # most prefill tokens placed on a group and not started yet; 0: no limit
    worker_dead_after_s: float = 3.0  # a group with no status for this long is dead
    max_waiting: int = 10_000  # waiting-queue bound; past it requests are rejected ("overloaded", 503)
    max_queue_time_s: float = 0.0  # a request still queued this long after arrival ends ("deadline"); 0: none
    status_log_every_s: float = 10.0

    def __post_init__(self) -> None:
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
    model_dir: str = ""
    group: str = "0"  # this worker group's name; the router places requests by it; auto: the replica's name
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (the model's, float32 on the CPU) | float32 | bfloat16 | float16
    kv_dtype: str = "auto"  # auto (the model dtype) | int8
    max_total_token_num: int = 0  # KV pool tokens; 0: sized from free memory
    mem_fraction: float = 0.9  # of the device memory, for weights plus KV pool
    cpu_kv_tokens: int = 32_768  # KV pool tokens on the CPU when max_total_token_num is 0
    batch_max_tokens: int = 8192  # prefill tokens per step
    running_max_req_size: int = 256
    max_req_total_len: int = 0  # 0: the model's context length
    status_interval_s: float = 0.5
    cuda_graph_max_bs: int = 512  # decode batches up to this size replay CUDA graphs; 0: none
    # steps with prompt tokens, up to this many tokens in all, replay CUDA graphs of everything but attention; 0: none
    # (one-GPU groups only, for now)
    cuda_graph_max_tokens: int = 2048
    # decode graphs: time cuBLASLt's algorithms (and each without its split-K) beside PyTorch's matmul for each
    # projection and bucket, and capture the fastest (services/worker/blas_choice.py); false: PyTorch's libraries only
    gemm_search: bool = True
    # on CUDA, one GPU, a float KV pool and no QKV bias: fold each layer's norm weights into its QKV and gate|up
    # weights, so a decode step runs no norm kernel in a layer (services/worker/models/fold.py); false: as loaded
    fold_norms: bool = True
    random_weights: bool = False  # draw weights from a seed on the device (benchmarks: no checkpoint needed)
    warmup: bool = True  # on CUDA, run a few prompts before serving so no request waits for a compile
    tp: int = 1  # tensor-parallel ranks of this group: one process per GPU (gloo on the CPU)

    def __post_init__(self) -> None:
        _check(bool(self.model_dir), "model_dir is required")
        _check(self.device in ("auto", "cpu", "cuda"), f"device must be auto, cpu or cuda, got {self.device}")
        _check(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype}",
        )
        _check(self.kv_dtype in ("auto", "int8"), f"kv_dtype must be auto or int8, got {self.kv_dtype}")
        _check(self.max_total_token_num >= 0, "max_total_token_num must be >= 0")
        _check(0.0 < self.mem_fraction <= 1.0, "mem_fraction must be in (0, 1]")
        _check(self.batch_max_tokens >= 16, "batch_max_tokens must be >= 16")
        _check(self.running_max_req_size >= 1, "running_max_req_size must be >= 1")
        _check(self.status_interval_s > 0, "status_interval_s must be > 0")
        _check(self.cuda_graph_max_bs >= 0, "cuda_graph_max_bs must be >= 0")
        _check(self.cuda_graph_max_tokens >= 0, "cuda_graph_max_tokens must be >= 0")
        _check(self.tp >= 1, f"tp must be >= 1, got {self.tp}")


@dataclass(frozen=True)
class DetokenizerConfig(CommonConfig):
    model_dir: str = ""

    def __post_init__(self) -> None:
        _check(bool(self.model_dir), "model_dir is required")
