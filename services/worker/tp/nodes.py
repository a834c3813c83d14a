"""A tensor-parallel group over several hosts (--nnodes, --node-rank, --dist-init-addr).

Node 0 runs the worker service as on one host: rank 0 talks to Redis, schedules and samples,
and starts its host's other ranks as child processes. Node k > 0 runs only its ranks
(``run_node``): child processes that join the same torch.distributed group at
--dist-init-addr (NCCL on GPUs, gloo on the CPU) and run every batch rank 0 sends. A batch's
host index goes to a rank on this host through a pipe; to a rank on another host through a
TCP connection to node 0 (``SocketPipe``, port + 1), which each such rank opens and names
itself on, and over which it says every BEAT_S that it lives: a cut link closes nothing, and
a collective across it would wait for torch.distributed's timeout (minutes), so rank 0's
watchdog takes a rank silent for DEAD_AFTER_S, or whose connection closed, for dead and ends
the group (its requests end with an explicit error). A rank that loses rank 0 leaves; node k
exits when its ranks have, for whoever runs it to start it again.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import select
import signal
import socket
import threading
import time

log = logging.getLogger(__name__)

_LEN = 8  # each message: its length, little-endian, then its bytes
BEAT_S = 1.0  # how often a rank on another host tells rank 0 it lives (an empty message)
DEAD_AFTER_S = 5.0  # rank 0 takes a rank on another host silent this long for dead


class SocketPipe:
    """The part of a multiprocessing pipe the step channel uses, over a TCP connection."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.heard = time.monotonic()  # rank 0's side: the last beat

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(len(data).to_bytes(_LEN, "little") + data)

    def recv_bytes(self) -> bytes:
        n = int.from_bytes(self._exactly(_LEN), "little")
        return self._exactly(n)

    def _exactly(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise EOFError("the connection closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def poll(self) -> bool:
        """Something to read (a message, or the end of the connection)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def silent_for(self) -> float:
        """Rank 0's side: seconds since the rank's last beat, the beats that came read;
        infinite once the connection has closed."""
        try:
            while self.poll():
                self.recv_bytes()
                self.heard = time.monotonic()
        except (EOFError, OSError):
            return float("inf")
        return time.monotonic() - self.heard

    def beat(self) -> None:
        """The rank's side: an empty message every BEAT_S, from a thread, while the connection lasts."""

        def run() -> None:
            try:
                while True:
                    self.send_bytes(b"")
                    time.sleep(BEAT_S)
            except OSError:
                return

        threading.Thread(target=run, name="rank-beat", daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def accept_ranks(port: int, ranks: range, timeout_s: float) -> list[SocketPipe]:
    """On node 0: a connection from each of the other hosts' ranks, in rank order."""
    by_rank: dict[int, SocketPipe] = {}
    with socket.create_server(("", port), reuse_port=False) as server:
        server.settimeout(timeout_s)
        while len(by_rank) < len(ranks):
            conn, peer = server.accept()
            conn.settimeout(None)
            pipe = SocketPipe(conn)
            rank = int.from_bytes(pipe.recv_bytes(), "little")
            if rank not in ranks or rank in by_rank:
                log.warning("refused a connection from %s naming rank %d", peer[0], rank)
                pipe.close()
                continue
            by_rank[rank] = pipe
            log.info("rank %d on %s joined the group", rank, peer[0])
    return [by_rank[r] for r in ranks]


def connect_rank(host: str, port: int, rank: int, timeout_s: float) -> SocketPipe:
    """On node k: connect to node 0 as ``rank``, trying again until node 0 listens."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            pipe = SocketPipe(socket.create_connection((host, port), timeout=5.0))
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)
    pipe.sock.settimeout(None)
    pipe.send_bytes(rank.to_bytes(_LEN, "little"))
    pipe.beat()
    return pipe


def run_node(cfg) -> int:
    """Node k > 0: run this host's ranks until they end; SIGTERM ends them. -> exit status."""
    from services.worker.tp.group import follower_main

    ctx = multiprocessing.get_context("spawn")
    procs = []
    for rank in cfg.ranks_here:
        proc = ctx.Process(target=follower_main, args=(cfg, rank, os.getpid(), None), name=f"tp-rank-{rank}")
        proc.start()
        procs.append(proc)
    log.info("node %d: ranks %s of %d, rank 0 at %s", cfg.node_rank, list(cfg.ranks_here), cfg.tp, cfg.dist_init_addr)

    def stop(*_: object) -> None:
        for p in procs:
            if p.is_alive():
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while all(p.is_alive() for p in procs):
        time.sleep(0.2)
    stop()  # one rank gone leaves the group broken: the others go too
    for p in procs:
        p.join(10)
    codes = [p.exitcode for p in procs]
    log.info("node %d: ranks ended (exit codes %s)", cfg.node_rank, codes)
    return 0 if all(c == 0 for c in codes) else 1
