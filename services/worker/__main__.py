"""python -m services.worker: one worker group, a tensor-parallel group of --tp ranks."""

from __future__ import annotations

import dataclasses
import os

from services.worker.build import build_engine, resolve_device
from services.worker.metrics import WorkerCollector, WorkerMetrics
from services.worker.parallel import TensorParallel
from services.worker.service import WorkerService
from services.worker.tp.channel import StepChannel
from services.worker.tp.group import RankWatchdog, free_port, init_rank, start_followers
from shared.cli import parse_config
from shared.config import WorkerConfig
from shared.heartbeat import HeartbeatPublisher
from shared.log import setup_logging
from shared.redis_link import RedisLink
from shared.service_main import run_beating, serve_collector, stop_on_signals
from shared.streams import SERVICE_WORKER, StreamNames

# --group auto names the group after the replica (host name and pid), so the replicas of one
# scaled service (docker compose up --scale worker=2) each form a data-parallel group of their
# own; in a container the pid is 1, so a restarted container comes back as the same group
GROUP_AUTO = "auto"


def main() -> None:
    cfg = parse_config(WorkerConfig, None, os.environ)
    if cfg.group == GROUP_AUTO:
        cfg = dataclasses.replace(cfg, group=cfg.replica)
    setup_logging(SERVICE_WORKER, cfg.replica, cfg.log_level)
    link = RedisLink(cfg.redis_url)
    stop_on_signals(link)
    tp, channel, followers = TensorParallel(), None, []
    if cfg.tp > 1:
        port = free_port()
        followers, pipes = start_followers(cfg, port)
        tp = init_rank(cfg, 0, port)
        channel = StepChannel(tp.group, resolve_device(cfg.device), pipes)
    engine = build_engine(cfg, tp, channel=channel)
    names = StreamNames(cfg.namespace)
    metrics = WorkerMetrics(cfg.group)
    service = WorkerService(engine, link, names, cfg.group, cfg.status_interval_s, cfg.stream_maxlen, metrics)
    serve_collector(cfg.metrics_port, WorkerCollector(metrics, engine))  # after loading: serving means ready
    watchdog = None
    if followers:

        def rank_died(why: str) -> None:
            service.abandon(why)
            watchdog.stop_all()  # type: ignore[union-attr]
            os._exit(1)  # the group restarts as a whole

        watchdog = RankWatchdog(followers, rank_died).start()
    kv = engine.kv
    beat = HeartbeatPublisher(
        link,
        names,
        SERVICE_WORKER,
        cfg.group,
        info=lambda: {"capacity_tokens": kv.capacity, "free_tokens": kv.free_tokens, "tp": cfg.tp},
    )

    def stop_ranks() -> None:
        if channel is None or watchdog is None:
            return
        watchdog.stopped.set()
        try:
            channel.stop()
        except RuntimeError:  # the group is broken already (a rank died): make sure all are gone
            watchdog.stop_all()
        for p in followers:
            p.join(10)

    run_beating("worker", beat, service.run, stop_ranks)


if __name__ == "__main__":
    main()
