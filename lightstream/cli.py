"""``lightstream serve [MODEL] [flags]``: the whole stack on this machine as processes.

Checks the model first (lightstream/model_check.py: a problem is one line and exit status
2, before anything starts), then starts redis-server on a free port unless ``REDIS_URL`` is
set (append-only, so a restarted one keeps the queues), the detokenizer(s), the router, the
worker group(s) and the HTTP front end(s); waits until /health is ready, prints the URL, and
from then on restarts any of them that exits, with backoff (tools/supervisor.py); Ctrl-C or
SIGTERM stops everything. Without a model it makes the tiny demo model
(tools/make_tiny_model.py) and serves it on the CPU.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lightstream.model_check import ModelCheckError, check_model
from lightstream.serve_config import ServeConfig, front_env, service_args
from shared.cli import parse_config, with_key_file
from shared.config import ConfigError
from shared.model_source import ModelSourceError, resolve_model

if TYPE_CHECKING:
    from tools.stack import Stack

USAGE = "usage: lightstream serve [MODEL] [flags]   (lightstream serve --help: every flag)"
DESCRIPTION = "Serve a model with the whole LightStream stack on this machine; each flag also reads its LS_* variable."
DEMO_DIR = os.path.join(tempfile.gettempdir(), "lightstream-tiny-llama")
# the Redis it starts: writes refused past this (docs/operations.md, Redis memory); streams hold
# about what is in flight (shared/stream_trim.py), a few MB at hundreds of requests
REDIS_MAXMEMORY = "1gb"
STOP_GRACE_S = 10.0  # past the drain timeout, for the services to close and exit before they are killed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "serve":
        print(USAGE, file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return serve(argv[1:], os.environ)


def serve(argv: list[str], env: Mapping[str, str]) -> int:
    try:
        cfg = with_key_file(parse_config(ServeConfig, argv, env, DESCRIPTION, prog="lightstream serve"))
    except ConfigError as e:  # an LS_* variable that does not parse, a key file that cannot be read
        return _fail(str(e))
    worker_first: list[str] = []
    if cfg.model_dir:
        try:
            model_dir = resolve_model(cfg.model_dir, env)
            check_model(model_dir, cfg)
        except (ModelCheckError, ModelSourceError) as e:
            return _fail(str(e))
        if model_dir != cfg.model_dir and not cfg.model_name:  # a model id: clients use it, as with vLLM
            cfg = dataclasses.replace(cfg, model_name=cfg.model_dir)
        model_dir = os.path.abspath(model_dir)  # the services run in the package's directory
    else:
        model_dir = _demo_model()
        worker_first = ["--device", "cpu"]
    return _run(cfg, model_dir, worker_first, env.get("REDIS_URL", ""))


def _gpus_per_group(cfg: ServeConfig) -> int:
    """Data-parallel groups on a machine with a GPU (--tp of them) for each: each group sees only
    its own; otherwise 0: every group sees every GPU (they share GPU 0, or run on the CPU)."""
    if cfg.dp < 2:
        return 0
    try:
        import torch
    except ImportError:  # the light image: no worker runs here anyway
        return 0
    if torch.cuda.device_count() < cfg.dp * cfg.tp:
        if torch.cuda.is_available():
            print(f"lightstream serve: {cfg.dp} groups of {cfg.tp} GPUs share this machine's GPUs", file=sys.stderr)
        return 0
    return cfg.tp


def _fail(message: str) -> int:
    print(f"lightstream serve: error: {message}", file=sys.stderr)
    return 2


def _demo_model() -> str:
    from tools import make_tiny_model

    if not os.path.exists(os.path.join(DEMO_DIR, "model.safetensors")):
        make_tiny_model.main(["--out", DEMO_DIR])
    return DEMO_DIR


def _run(cfg: ServeConfig, model_dir: str, worker_first: list[str], redis_url: str) -> int:
    from tools.redis_server import RedisServer
    from tools.supervisor import Child, Supervisor

    redis_server = None
    if not redis_url:
        try:
            # a password of its own: other users of the host reach its port too
            redis_server = RedisServer(appendonly=True, maxmemory=REDIS_MAXMEMORY, password=secrets.token_hex(16))
            redis_server.start()
        except (OSError, RuntimeError) as e:
            return _fail(f"cannot start redis-server ({e}); install it (apt-get install redis-server) or set REDIS_URL")
        redis_url = redis_server.url
    stack = _stack(cfg, model_dir, worker_first, redis_url)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    children = stack.children()
    if redis_server is not None:
        server = redis_server
        children.insert(0, Child("redis-server", lambda: server.proc, lambda: server.start()))
    supervisor = Supervisor(children, stopping)
    try:
        stack.start()
        # a large model loads, captures its graphs and warms up for minutes; a service that exits ends the wait
        stack.wait_ready(timeout_s=3600.0, stopping=stopping)
        supervisor.start()
        if not stopping.is_set():
            shown = redis_url if redis_server is None else redis_server.url.replace(redis_server.password, "***")
            print(f"LightStream is serving {model_dir} at {stack.url} (redis {shown})", flush=True)
            print(
                f"try: curl {stack.url}/generate -H 'Content-Type: application/json' "
                '-d \'{"inputs": "What is AI?", "parameters": {"max_new_tokens": 17}}\'',
                flush=True,
            )
            stopping.wait()
    except (RuntimeError, TimeoutError) as e:  # a service that exited while starting, or never got ready
        return _fail(str(e))
    finally:
        stopping.set()
        if supervisor.started:
            supervisor.join()  # no restart behind stop's back
        stack.stop(timeout_s=cfg.drain_timeout_s + STOP_GRACE_S)  # each drains what it holds first
        if redis_server is not None:
            redis_server.stop()
    return 0


def _stack(cfg: ServeConfig, model_dir: str, worker_first: list[str], redis_url: str) -> Stack:
    from tools.stack import Stack, StackOptions

    args = service_args(cfg)
    return Stack(
        StackOptions(
            model_dir=model_dir,
            redis_url=redis_url,
            host=cfg.host,
            port=cfg.port,
            workers=cfg.dp,
            detokenizers=cfg.detokenizers,
            visuals=cfg.visuals,
            fronts=cfg.fronts,
            log_dir=cfg.log_dir,
            worker_args=[*worker_first, *args["worker"]],
            router_args=args["router"],
            tokenizer_args=args["tokenizer"],
            detokenizer_args=args["detokenizer"],
            visual_args=args["visual"],
            gpus_per_worker=_gpus_per_group(cfg),
            tokenizer_env=front_env(cfg),
        )
    )
