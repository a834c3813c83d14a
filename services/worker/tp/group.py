"""A tensor-parallel worker group: one process per rank, started and watched by rank 0.

Rank 0 is the worker service's own process: it talks to Redis, schedules and samples.
The other ranks are child processes that run each batch rank 0 sends them (channel.py).
All ranks join one torch.distributed group: NCCL on GPUs (a host's ranks on its GPUs in
order), gloo on the CPU. A group may span hosts (nodes.py): then the other hosts' ranks are
theirs to start, and rank 0 takes them in over TCP. A rank that dies takes the whole group
down on purpose: rank 0's watchdog ends every request it holds with an explicit error and
exits, so the service restarts as a whole (compose's restart policy, or whoever runs it) and
the router places requests on it again once its new instance reports.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from services.worker.tp.channel import StepChannel
from services.worker.tp.nodes import DEAD_AFTER_S, SocketPipe, accept_ranks, connect_rank
from services.worker.tp.parallel import TensorParallel
from shared.config import WorkerConfig

log = logging.getLogger(__name__)

INIT_TIMEOUT = timedelta(minutes=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous(cfg: WorkerConfig) -> tuple[str, int]:
    """Where the ranks meet: a free local port on one host, --dist-init-addr across hosts."""
    return cfg.dist_address if cfg.nnodes > 1 else ("127.0.0.1", free_port())


def init_rank(cfg: WorkerConfig, rank: int, at: tuple[str, int]) -> TensorParallel:
    """Join the group as `rank`; on CUDA, a host's ranks take its GPUs in order."""
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(rank - cfg.ranks_here.start)
    else:
        # a host's ranks share its cores: more threads each would only fight over them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(cfg.ranks_here)))
    host, port = at
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        init_method=f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}",
        world_size=cfg.tp,
        rank=rank,
        timeout=INIT_TIMEOUT,
    )
    return TensorParallel(rank=rank, size=cfg.tp, group=dist.group.WORLD)


@dataclass
class RankGroup:
    """Rank 0's side of a running group: its TensorParallel, the channel its batches go out
    by, and the processes of the other ranks."""

    tp: TensorParallel
    channel: StepChannel
    followers: list[multiprocessing.Process]
    remote: list[SocketPipe]  # the connections to the other hosts' ranks

    def stop(self, join_s: float) -> None:
        """Tell the other ranks to leave, and wait up to join_s for each to exit."""
        self.channel.stop()
        for p in self.followers:
            p.join(join_s)


def start_group(cfg: WorkerConfig) -> RankGroup:
    """Join a group of cfg.tp ranks as rank 0 here, this host's others started as child
    processes, the other hosts' taken in as they connect."""
    from services.worker.build import resolve_device

    at = rendezvous(cfg)
    followers, pipes = start_followers(cfg, at)
    others = range(len(cfg.ranks_here), cfg.tp)  # the other hosts' ranks
    remote = accept_ranks(at[1] + 1, others, INIT_TIMEOUT.total_seconds()) if others else []
    tp = init_rank(cfg, 0, at)
    channel = StepChannel(tp.group, resolve_device(cfg.device), [*pipes, *remote])
    return RankGroup(tp, channel, followers, remote)


def start_followers(cfg: WorkerConfig, at: tuple[str, int]) -> tuple[list[multiprocessing.Process], list[Connection]]:
    """-> the processes of this host's ranks after 0, and the pipe that carries each one its batches."""
    ctx = multiprocessing.get_context("spawn")
    procs, pipes = [], []
    for rank in cfg.ranks_here[1:]:
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=follower_main, args=(cfg, rank, os.getpid(), reader, at), name=f"tp-rank-{rank}")
        proc.start()
        reader.close()  # the rank holds it now: its end closing is how the rank learns rank 0 is gone
        procs.append(proc)
        pipes.append(writer)
    if procs:
        log.info("started tensor-parallel ranks %s (pids %s)", list(cfg.ranks_here[1:]), [p.pid for p in procs])
    return procs, pipes


def follower_main(
    cfg: WorkerConfig, rank: int, parent: int, pipe: Connection | None, at: tuple[str, int] | None = None
) -> None:
    """Every rank but 0: build the same model shard and run every batch rank 0 sends. Without a
    pipe (a rank on another host than rank 0), it connects to rank 0's host for its batches."""
    from services.worker.build import build_model_stack
    from shared.log import setup_logging
    from shared.streams import SERVICE_WORKER

    setup_logging(SERVICE_WORKER, f"{cfg.replica}-rank{rank}", cfg.log_level, cfg.log_format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 decides when the group stops
    _exit_with_parent(parent)
    at = at or cfg.dist_address
    if pipe is None:
        pipe = connect_rank(at[0], at[1] + 1, rank, INIT_TIMEOUT.total_seconds())  # type: ignore[assignment]
    tp = init_rank(cfg, rank, at)
    stack = build_model_stack(cfg, tp)
    channel = StepChannel(tp.group, stack.device, [pipe])
    log.info("rank %d ready", rank)
    steps = 0
    with torch.inference_mode():
        while (batch := channel.receive(stack.table.table)) is not None:
            stack.runner.forward(batch)
            steps += 1
    log.info("rank %d stopping after %d steps", rank, steps)
    leave_group()


def leave_group(timeout_s: float = 10.0) -> None:
    """Tear the process group down, but never hang on it: NCCL's teardown can wait for peers
    that have left already, and a process that is about to exit loses nothing by not waiting."""
    done = threading.Event()

    def destroy() -> None:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
        done.set()

    threading.Thread(target=destroy, name="leave-group", daemon=True).start()
    if not done.wait(timeout_s):
        log.warning("the process group did not tear down within %.0f s; leaving it", timeout_s)


def _exit_with_parent(parent: int) -> None:
    """A rank whose rank 0 is gone has nothing to do: leave even if a collective is stuck."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class RankWatchdog:
    """On rank 0: notices a dead rank and calls on_death once (which must not return)."""

    def __init__(
        self, procs: list[multiprocessing.Process], on_death: Callable[[str], None], remote: list[SocketPipe] = ()
    ) -> None:
        self.procs = procs
        self.remote = list(remote)
        self.on_death = on_death
        self._thread = threading.Thread(target=self._run, name="rank-watchdog", daemon=True)
        self.stopped = threading.Event()

    def start(self) -> RankWatchdog:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(0.2):
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                why = ", ".join(f"{p.name} (exit code {p.exitcode})" for p in dead)
                self.on_death(f"tensor-parallel rank died: {why}")
                return
            silent = [s for pipe in self.remote if (s := pipe.silent_for()) > DEAD_AFTER_S]
            if silent:
                why = "its connection closed" if max(silent) == float("inf") else f"silent for {max(silent):.0f} s"
                self.on_death(f"tensor-parallel rank died: a rank on another host is gone ({why})")
                return

    def stop_all(self) -> None:
        self.stopped.set()
        for p in self.procs:
            if p.is_alive():
                p.kill()
