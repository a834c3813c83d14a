"""tools/netns_hosts.py and tools/netns_thread.py on real namespaces (root and iproute2 only):
a thread on one host reaches another over the bridge, a cut link stops that and a restored one
brings it back, and every namespace is gone after stop."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.polling import until
from tools import netns_hosts

pytestmark = pytest.mark.skipif(not netns_hosts.available(), reason="needs root and iproute2 (network namespaces)")


def _reach(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_hosts_reach_each_other_over_their_links_until_one_is_cut() -> None:
    hosts = netns_hosts.Hosts(["a", "b"]).start()
    try:
        b = hosts.address["b"]
        server = hosts.run("b", socket.create_server, (b, 7000))
        assert hosts.run("a", _reach, b, 7000)
        hosts.cut("b")
        assert not hosts.run("a", _reach, b, 7000)
        assert hosts.run("b", _reach, b, 7000)  # a cut host still reaches itself
        hosts.restore("b")
        until(lambda: hosts.run("a", _reach, b, 7000), 10, "b reached again")  # the link's carrier comes up
        server.close()
    finally:
        hosts.stop()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not [ns for ns in [*hosts.ns.values(), hosts.switch] if ns in names]
