"""Hosts on one machine for the multi-host tests: network namespaces joined by veth links.

Each host is a namespace with its loopback and one interface, ``eth0``, at 10.<net>.0.<k>/24,
whose peer sits on a bridge in a switch namespace of its own; nothing is added to the
machine's own network. ``cut`` and ``restore`` take a host's link down and up. ``argv``
prefixes a command so that it runs on a host (``ip netns exec``, which execs: the process
keeps its pid); ``run`` runs a function on a host from this process (tools/netns_thread.py),
so a test can be a client there. Needs root and iproute2.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Callable
from typing import TypeVar

from tools.netns_thread import HostThread

T = TypeVar("T")


def available() -> bool:
    """Root with iproute2, where namespaces can be made (a test skips otherwise)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"lsprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Hosts:
    def __init__(self, names: list[str]) -> None:
        tag = f"{os.getpid() % 10000}{random.randint(0, 99)}"
        self.net = random.randint(64, 127)
        self.switch = f"ls{tag}sw"
        self.ns = {name: f"ls{tag}{name}" for name in names}
        self.address = {name: f"10.{self.net}.0.{k + 1}" for k, name in enumerate(names)}
        self._ports = {name: f"ls{tag}p{k}" for k, name in enumerate(names)}
        self._threads: dict[str, HostThread] = {}

    def start(self) -> Hosts:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for name, ns in self.ns.items():
            port = self._ports[name]
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", port, "netns", self.switch, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def argv(self, host: str, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns[host], *command]

    def run(self, host: str, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on a thread whose network is the host's: its sockets, and the processes it
        starts, are on that host. Each host has one such thread, so calls to a host run in turn."""
        if host not in self._threads:
            self._threads[host] = HostThread(f"/run/netns/{self.ns[host]}")
        return self._threads[host].run(fn, *args)

    def cut(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self._ports[host], "down")

    def restore(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self._ports[host], "up")

    def stop(self) -> None:
        for thread in self._threads.values():
            thread.close()
        for ns in [*self.ns.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __enter__(self) -> Hosts:
        try:
            return self.start()
        except BaseException:
            self.stop()  # a half-made set of namespaces is removed too
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
