"""A tensor-parallel group whose two ranks run on two hosts (network namespaces joined by a
veth link, tools/netns_hosts.py), gloo underneath: host a runs Redis, the router, the
detokenizer, the front end and node 0 (rank 0, the only rank that talks to Redis); host b runs
node 1 (rank 1) alone, reaching host a only over the link. Eight concurrent requests get Hugging
Face's greedy output, which the TP=1 stack is held to elsewhere, so TP=2 across hosts equals TP=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import hf_reference
from tools import netns_hosts
from tools.redis_server import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not netns_hosts.available(), reason="needs root and iproute2 (network namespaces)"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！",
    "def f(x): return x +",
    "Once upon a time there was a small town by the sea.",
    "A B C D E F G",
    "Tensor parallelism splits each layer's heads",
    "over two hosts",
]
MAX_NEW = 12
# gloo names its own address from the host name, which on a namespace without its own DNS is the
# loopback's: each rank must use its host's link (on real hosts, where the host name resolves to
# the host's address, this is needed only with several interfaces)
GLOO_ENV = {"GLOO_SOCKET_IFNAME": "eth0"}


def test_tp2_with_a_rank_on_each_of_two_hosts_equals_hf(tiny_llama: str, tmp_path) -> None:
    env = {**os.environ, **GLOO_ENV, "PYTHONPATH": ROOT}
    with netns_hosts.Hosts(["a", "b"]) as hosts:
        dist = f"{hosts.address['a']}:{free_port()}"
        node1 = [sys.executable, "-m", "services.worker", "--model-dir", tiny_llama, "--replica", "node1"]
        node1 += ["--device", "cpu", "--tp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", dist]
        with open(tmp_path / "node1.log", "wb") as log:
            rank1 = subprocess.Popen(hosts.argv("b", node1), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            driver = [sys.executable, "-m", "tests.integration.multinode_driver", tiny_llama, dist, str(tmp_path)]
            driver += [json.dumps(PROMPTS), str(MAX_NEW)]
            on_a = hosts.argv("a", driver)
            out = subprocess.run(on_a, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
            # the driver's stack stopping stops rank 0, so rank 1 leaves the group and node 1 exits
            assert rank1.wait(30) == 0, (tmp_path / "node1.log").read_text()[-2000:]
        finally:
            if rank1.poll() is None:
                rank1.kill()
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, out.stderr[-3000:]
    result = json.loads(lines[-1])
    assert "ids" in result, result
    tok = hf_reference.tokenizer(tiny_llama)
    for prompt, ids in zip(PROMPTS, result["ids"], strict=True):
        assert ids == hf_reference.greedy(tiny_llama, tok(prompt)["input_ids"], MAX_NEW), prompt
