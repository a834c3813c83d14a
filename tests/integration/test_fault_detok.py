"""Fault suite: a detokenizer shard killed under load, two shards, greedy requests. Its requests'
registrations and the tokens whose text went out are in its stream: the other shard takes the
stream over (services/detokenizer/adoption.py) and the requests complete, with the text an
unbroken stack gives. Started again, the killed shard waits for its stream to be let go, then
serves again."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from shared.heartbeat import live_replicas
from shared.redis_link import RedisLink
from shared.streams import SERVICE_DETOK, StreamNames
from tests.integration.conftest import start_stack
from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts, reference_texts
from tests.integration.router_live import wait_until
from tools.redis_server import RedisServer
from tools.stack import Stack

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

# requests long enough, and enough of them, that detok-0 still holds some when it is killed: its
# heartbeat's count of open requests is up to a second old (with 32 tokens and 6 clients they had
# all ended once, and the takeover found none)
MAX_NEW = 64
CLIENTS = 8


def test_a_killed_detokenizers_requests_are_taken_over_and_complete(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    stack = start_stack(tiny_llama, redis_server, str(tmp_path), detokenizers=2)
    try:
        reference, tally = asyncio.run(_kill_shard(stack))
    finally:
        stack.stop()
    log = (tmp_path / "detokenizer-1.log").read_text()
    taken = sum(int(n) for n in re.findall(r"took over (\d+) open requests of shard detok-0", log))
    print(tally.summary("a detokenizer shard killed"), f"taken over: {taken}")
    assert taken > 0  # requests were in flight on the killed shard
    assert tally.count(LOST) == 0, tally.of(LOST)
    assert tally.count(ERROR) == 0, tally.of(ERROR)
    assert not tally.wrong_texts(reference), tally.wrong_texts(reference)[:3]
    assert tally.count(COMPLETED) > 0


async def _kill_shard(stack: Stack) -> tuple[dict[str, str], Tally]:
    texts = prompts(12)
    reference = await reference_texts(stack.url, texts, MAX_NEW)
    link = RedisLink(stack.opts.redis_url)
    names = StreamNames(stack.opts.namespace)
    async with Load(stack.url, texts, CLIENTS, MAX_NEW, bound_s=40) as load:
        await load.completed_since(time.monotonic(), 4, 60)  # requests flow
        await asyncio.to_thread(wait_until, lambda: _open_on(link, names) >= 2, 30, "requests open on detok-0")
        await asyncio.to_thread(stack.kill_service, "detokenizer-0")
        killed = time.monotonic()
        took = lambda: _taken_over(link, names) or _adopted_in_log(stack)
        await asyncio.to_thread(wait_until, took, 30, "detok-0's stream taken over")
        await load.completed_since(killed, 6, 60)
        stack.start_service("detokenizer-0")
        await asyncio.to_thread(wait_until, lambda: _serving(link, names), 60, "detok-0 serving again")
        await load.completed_since(time.monotonic(), 6, 60)
    link.close()
    return reference, load.tally


def _beat_info(link: RedisLink, names: StreamNames) -> dict[str, float] | None:
    hb = live_replicas(link, names, SERVICE_DETOK).get("detok-0")
    return None if hb is None else hb.info


def _open_on(link: RedisLink, names: StreamNames) -> float:
    """Requests open on detok-0 by its heartbeat (refreshed every second)."""
    info = _beat_info(link, names)
    return 0.0 if info is None else info.get("sessions", 0.0)


def _taken_over(link: RedisLink, names: StreamNames) -> bool:
    info = _beat_info(link, names)
    return info is not None and bool(info.get("taken_over"))


def _adopted_in_log(stack: Stack) -> bool:
    """detok-1 said it took detok-0's stream over: the adopted requests may all end within the
    heartbeat's second, before the beat in detok-0's name is seen."""
    path = os.path.join(stack.opts.log_dir, "detokenizer-1.log")
    if not os.path.exists(path):
        return False
    with open(path, errors="replace") as f:
        return "shard detok-0 is gone: taking its stream over" in f.read()


def _serving(link: RedisLink, names: StreamNames) -> bool:
    info = _beat_info(link, names)
    return info is not None and not info.get("taken_over") and not info.get("draining")
