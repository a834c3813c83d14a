"""python -m services.tokenizer: the HTTP front end (validation, tokenization, replies)."""

from __future__ import annotations

import logging
import os
import socket
import time

import uvicorn

from services.tokenizer.app import create_app
from services.tokenizer.drain import CLOSE_S, Drain, DrainingServer
from services.tokenizer.generation import FrontContext
from services.tokenizer.header_deadline import http_protocol
from services.tokenizer.images.front import ImageFront
from services.tokenizer.metrics import FrontMetrics
from services.tokenizer.pipeline import Pipeline
from services.tokenizer.tokenization import Tokenization, load_chat_template
from shared.busy_poll import BusyPoll
from shared.cli import parse_config, with_key_file
from shared.config import ConfigError, TokenizerConfig
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.model_config import ModelConfig
from shared.redis_link import RedisLink, RedisTarget
from shared.service_main import run_beating
from shared.streams import SERVICE_TOKENIZER, StreamNames

log = logging.getLogger("services.tokenizer")


def main() -> None:
    try:
        cfg = with_key_file(parse_config(TokenizerConfig, None, os.environ))
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    setup_logging(SERVICE_TOKENIZER, cfg.replica, cfg.log_level, cfg.log_format)
    model = ModelConfig.from_dir(cfg.model_dir)
    try:
        template = load_chat_template(cfg.chat_template) if cfg.chat_template else ""
    except (OSError, ValueError) as e:
        raise SystemExit(f"--chat-template: {e}") from None
    max_total_len = min(cfg.max_req_total_len or model.context_length, model.context_length)
    link = RedisLink(RedisTarget.of(cfg))
    names = StreamNames(cfg.namespace)
    pipeline = Pipeline(
        link,
        names,
        cfg.replica,
        cfg.stream_maxlen,
        cfg.pipeline_dead_after_s,
        cfg.pipeline_check_s,
        BusyPoll.for_host(cfg.busy_poll_ms, by="the event loop"),  # its reads are the loop's own (redis.asyncio)
        cfg.router_dead_after_s,
    )
    tok = Tokenization(cfg.tokenizer or cfg.model_dir, cfg.tokenizer_threads, template)
    ctx = FrontContext(
        cfg=cfg,
        pipeline=pipeline,
        tok=tok,
        max_total_len=max_total_len,
        model_name=cfg.served_model_name(),
        vocab_size=model.vocab_size,
        metrics=FrontMetrics(cfg.served_model_name()),
        started=time.time(),
        images=ImageFront(cfg, model.vision, tok.token_text(model.vision.image_token_id) if model.vision else ""),
    )
    beat = HeartbeatPublisher(
        link, names, SERVICE_TOKENIZER, cfg.replica, info=lambda: {"in_flight": len(pipeline.pending)}
    )
    log.info("serving %s on %s:%d (max request length %d tokens)", ctx.model_name, cfg.host, cfg.port, max_total_len)
    drain = Drain(cfg.drain_timeout_s)
    app = create_app(ctx, drain)
    # no access log: uvicorn writes its line when the response starts, ahead of a stream's
    # first event, and the front end logs each request itself, with its request id
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level.lower(),
        log_config=None,
        access_log=False,
        interface="asgi3",  # the app is plain ASGI middleware (app.py): no guessing from its __call__
        timeout_graceful_shutdown=CLOSE_S,  # after the drain (drain.py)
        limit_concurrency=cfg.max_connections,  # past it (connections or requests), 503
        http=http_protocol(cfg.header_timeout_s),  # closes a connection slow to send a request's head
    )
    server = DrainingServer(config, drain, fail_pending=pipeline.fail_all)
    sockets = [shared_listener(cfg.host, cfg.port)] if cfg.reuse_port else None
    # SIGTERM and SIGINT start a drain (drain.py), then the server stops and the process exits 0
    run_beating("front end", beat, lambda: server.run(sockets=sockets))


def shared_listener(host: str, port: int) -> socket.socket:
    """A listening socket on host:port that other processes may bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
