"""A thread that lives in another network namespace, for code that must act as a client on one
of tools/netns_hosts.py's hosts without a process of its own there.

Linux keeps the network namespace per thread: ``setns(2)`` moves only the calling thread, and
the sockets it opens, the event loops it runs and the processes it starts belong to that
namespace from then on. Python 3.11 has no ``os.setns``, so libc's is called through ctypes
(a system call with a stable interface, present since Linux 3.0).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000


def _enter(path: str) -> None:
    """Move the calling thread into the network namespace at path (/run/netns/NAME)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class HostThread:
    """One thread in the namespace at ``path``; ``run`` calls a function on it and returns its
    result (or raises its exception)."""

    def __init__(self, path: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, initializer=_enter, initargs=(path,))

    def run(self, fn: Callable[..., T], *args: object) -> T:
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
