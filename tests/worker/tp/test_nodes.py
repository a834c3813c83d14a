"""A group over several hosts: its flags, and the TCP pipes that carry the batches to the other
hosts' ranks (the group itself runs across network namespaces in tests/integration/test_multinode_tp.py)."""

from __future__ import annotations

import threading
import time

import pytest

from services.worker.tp.nodes import DEAD_AFTER_S, accept_ranks, connect_rank
from shared.config import ConfigError, WorkerConfig
from tools.redis_server import free_port


def test_flags_place_each_hosts_ranks() -> None:
    cfg = WorkerConfig(model_dir="m", tp=4, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:29500")
    assert cfg.ranks_here == range(2, 4) and cfg.dist_address == ("10.0.0.1", 29500)
    assert WorkerConfig(model_dir="m", tp=2).ranks_here == range(0, 2)
    assert WorkerConfig(model_dir="m", tp=2, nnodes=2, dist_init_addr="[::1]:1").dist_address == ("::1", 1)
    bad = [
        ({"tp": 3, "nnodes": 2, "dist_init_addr": "h:1"}, "nnodes must divide tp"),
        ({"tp": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, "node_rank"),
        ({"tp": 2, "nnodes": 2}, "dist_init_addr is required"),
        ({"tp": 2, "nnodes": 2, "dist_init_addr": "h"}, "dist_init_addr: bad"),
    ]
    for kw, message in bad:
        with pytest.raises(ConfigError, match=message):
            WorkerConfig(model_dir="m", **kw)


def test_other_hosts_ranks_are_taken_in_rank_order_and_carry_batches() -> None:
    port = free_port()
    got: list = []
    acceptor = threading.Thread(target=lambda: got.extend(accept_ranks(port, range(2, 4), 10.0)))
    acceptor.start()
    third = connect_rank("127.0.0.1", port, 3, 10.0)
    stray = connect_rank("127.0.0.1", port, 9, 10.0)  # no such rank here: refused
    second = connect_rank("127.0.0.1", port, 2, 10.0)
    acceptor.join(10)
    to_second, to_third = got
    big = bytes(range(256)) * 10_000
    to_second.send_bytes(b"for 2")
    to_third.send_bytes(big)
    assert second.recv_bytes() == b"for 2" and third.recv_bytes() == big
    with pytest.raises((EOFError, ConnectionResetError)):  # closed, or reset when it closed with bytes unread
        stray.recv_bytes()
    before = to_second.heard
    time.sleep(1.5)
    assert to_second.silent_for() < DEAD_AFTER_S and to_second.heard > before  # a rank beats every second
    second.close()
    end = time.monotonic() + 5
    while to_second.silent_for() < float("inf") and time.monotonic() < end:  # the close crossing over
        time.sleep(0.01)
    assert to_second.silent_for() == float("inf")
    for pipe in (to_second, to_third, third, stray):
        pipe.close()
