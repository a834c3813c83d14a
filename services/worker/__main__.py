"""python -m services.worker: one worker group, a tensor-parallel group of --tp ranks."""

from __future__ import annotations

import dataclasses
import os
import threading

from services.worker.build import build_engine
from services.worker.image_intake import ImageIntake
from services.worker.metrics import WorkerCollector, WorkerMetrics
from services.worker.runtime.warmup import warm_up
from services.worker.service import WorkerService
from services.worker.tp.group import RankWatchdog, start_group
from services.worker.tp.nodes import run_node
from shared.busy_poll import BusyPoll
from shared.cli import parse_config
from shared.config import WorkerConfig
from shared.drain import Drain
from shared.heartbeat import HeartbeatPublisher
from shared.image_store import ImageStore
from shared.log import setup_logging
from shared.redis_link import RedisLink, RedisTarget
from shared.service_main import drain_on_signals, run_beating, serve_collector, stop_on_signals
from shared.streams import SERVICE_WORKER, StreamNames

# --group auto names the group after the replica (host name and pid), so the replicas of one
# scaled service (docker compose up --scale worker=2) each form a data-parallel group of their
# own; in a container the pid is 1, so a restarted container comes back as the same group
GROUP_AUTO = "auto"


def _load(cfg: WorkerConfig):
    """The group's other ranks (with --tp) and the engine, warmed up."""
    group = start_group(cfg) if cfg.tp > 1 else None  # with --nnodes, waits for the other hosts' ranks
    engine = build_engine(cfg) if group is None else build_engine(cfg, group.tp, channel=group.channel)
    engine.grammars.start()  # the vocabulary for structured output, read in its thread meanwhile
    if cfg.warmup and engine.device.type == "cuda":
        warm_up(engine, engine.runner.model.cfg.vocab_size)
    return group, engine


def _image_intake(engine, link: RedisLink, names: StreamNames) -> ImageIntake | None:
    """A vision-language model's worker reads its requests' images' embeddings from Redis."""
    model = engine.runner.model
    if model.cfg.vision is None:
        return None
    grids = bool(model.cfg.mrope_section)
    return ImageIntake(ImageStore(link, names), model.cfg.hidden_size, model.dtype, engine.device, grids)


def main() -> None:
    cfg = parse_config(WorkerConfig, None, os.environ)
    if cfg.group == GROUP_AUTO:
        cfg = dataclasses.replace(cfg, group=cfg.replica)
    setup_logging(SERVICE_WORKER, cfg.replica, cfg.log_level, cfg.log_format)
    if cfg.node_rank > 0:  # only this host's ranks of a group that spans hosts: rank 0 talks to Redis
        raise SystemExit(run_node(cfg))
    link = RedisLink(RedisTarget.of(cfg))
    stop_on_signals(link)  # while loading: nothing to drain
    group, engine = _load(cfg)
    names = StreamNames(cfg.namespace)
    metrics = WorkerMetrics(cfg.group)
    drain_requested = threading.Event()
    service = WorkerService(
        engine,
        link,
        names,
        cfg.group,
        cfg.status_interval_s,
        cfg.stream_maxlen,
        metrics,
        BusyPoll.for_host(cfg.busy_poll_ms),
        Drain(drain_requested, cfg.drain_timeout_s),
        _image_intake(engine, link, names),
    )
    drain_on_signals(link, drain_requested)
    serve_collector(cfg.metrics_port, WorkerCollector(metrics, engine), cfg.served_model_name())  # loaded: ready
    watchdog = None
    if group is not None:

        def rank_died(why: str) -> None:
            service.abandon(why)
            watchdog.stop_all()  # type: ignore[union-attr]
            os._exit(1)  # the group restarts as a whole

        watchdog = RankWatchdog(group.followers, rank_died, group.remote).start()
    kv = engine.kv
    beat = HeartbeatPublisher(
        link,
        names,
        SERVICE_WORKER,
        cfg.group,
        info=lambda: {
            "capacity_tokens": kv.capacity,
            "free_tokens": kv.free_tokens,
            "evictable_tokens": kv.evictable_tokens,
            "tp": cfg.tp,
        },
    )

    def stop_ranks() -> None:
        if group is None or watchdog is None:
            return
        watchdog.stopped.set()
        # a rank stuck in a collective does not read its pipe: it goes when this process does
        group.stop(join_s=10)

    run_beating("worker", beat, service.run, stop_ranks)


if __name__ == "__main__":
    main()
