"""Two worker groups on the CPU: requests spread over both; a group that goes silent and is
killed under load has its unstarted requests finished by the other and its started ones
ended with an explicit error; nothing hangs; restarted, it takes requests again."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx

from tests.integration.conftest import start_stack
from tests.integration.router_live import (  # noqa: F401 (_long_llama: a fixture)
    RouterProbe,
    _long_llama,
    admitted,
    plain_generate,
    stream_generate,
)
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack


async def _burst(url: str, n: int, max_new: int) -> list[tuple[int, dict]]:
    async with httpx.AsyncClient(base_url=url, timeout=90) as client:
        return await asyncio.gather(*(plain_generate(client, f"Request number {i} says", max_new) for i in range(n)))


LONG = 3_000  # output tokens of the requests running when a group dies: two fit a pool, three do not
POOL = 8_000


def test_two_worker_groups_share_the_load_survive_a_death_and_take_back_a_restart(
    long_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    metrics_port = free_port()
    stack = start_stack(
        long_llama,
        redis_server,
        str(tmp_path),
        workers=2,
        worker_args=["--max-total-token-num", str(POOL)],
        # DEBUG: each placement; least_loaded: these prompts share their first words, which the
        # cache-aware policy would send to one group (tests/router covers that policy)
        router_args=["--metrics-port", str(metrics_port), "--log-level", "DEBUG", "--routing-policy", "least_loaded"],
    )
    probe = RouterProbe(metrics_port)
    try:
        probe.wait_for(lambda f: f["worker_groups"] == 2, 60, "both groups known to the router")
        _share_the_load(stack, probe)
        _assert_the_death_handled(probe, *asyncio.run(_kill_under_load(stack, probe)))
        _take_back_a_restart(stack, probe)
    finally:
        stack.stop()


def _share_the_load(stack: Stack, probe: RouterProbe) -> None:
    """Requests spread over both groups."""
    assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 6, 8)))
    f = probe.figures()
    assert admitted(f, "0") >= 1 and admitted(f, "1") >= 1, f
    # both groups report them ended, so the next requests are placed on even terms
    probe.wait_for(lambda f: f["running_requests"] == 0, 30, "the first requests reported ended")


async def _kill_under_load(stack: Stack, probe: RouterProbe) -> tuple[list, list, list[asyncio.Task], float]:
    """Four long requests, two per group; group 1 goes silent, gets short requests placed on it,
    and is killed. Returns the long ones that ended, the short ones' results, the long ones
    still running (cancelled), and when group 1 went silent."""
    async with httpx.AsyncClient(base_url=stack.url, timeout=90) as client:
        started = [asyncio.Event() for _ in range(4)]
        longs = [
            asyncio.create_task(stream_generate(client, f"Long story {i} begins", LONG, started[i])) for i in range(4)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        f = probe.figures()
        on_dying = int(f['group_running_requests{group="1"}'])
        assert on_dying == 2, f  # two per group: a pool cannot hold three
        # the router learns of a first token from the group's next status, which may leave
        # after the token itself: wait until it has seen group 1 hold 16 more tokens than
        # it knew of when the clients had their first ones, so it knows both requests
        # have output (else it would re-queue them when the group dies)
        used = 'group_used_tokens{group="1"}'
        await asyncio.to_thread(
            probe.wait_for, lambda g: g[used] >= f[used] + 16, 30, "group 1's requests known to have output"
        )
        # group 1 goes silent with requests running; the router keeps placing new ones
        # there until it declares the group dead, and those never start
        stack.signal_service("worker-1", signal.SIGSTOP)
        silent_at = time.monotonic()
        # prompts of about 500 tokens: each placement outweighs how far the two groups'
        # running requests have drifted apart, so the router alternates between them
        shorts = [
            asyncio.create_task(plain_generate(client, f"Short one {i}: " + "the river " * 250, 16)) for i in range(4)
        ]
        await asyncio.to_thread(
            probe.wait_for,
            lambda g: admitted(g, "1") > admitted(f, "1"),
            30,
            "a request placed on the silent group",
        )
        stack.kill_service("worker-1")
        # the killed group's two end with an error; the other two keep running
        deadline = time.monotonic() + 60
        while sum(t.done() for t in longs) < on_dying:
            assert time.monotonic() < deadline, "the killed group's requests never ended"
            await asyncio.sleep(0.1)
        ended = [t.result() for t in longs if t.done()]
        short_results = await asyncio.wait_for(asyncio.gather(*shorts), 120)
        running = [t for t in longs if not t.done()]
        for t in running:
            t.cancel()
        return ended, short_results, running, silent_at


def _assert_the_death_handled(
    probe: RouterProbe, ended: list, shorts: list, running: list[asyncio.Task], silent_at: float
) -> None:
    """The killed group's started requests ended with an error soon after it went silent; its
    unstarted ones were re-queued and finished by the other group."""
    failed = [(last, at) for last, _, at in ended if last["finish_reason"] == "error"]
    assert len(failed) == 2, ended
    for last, _ in failed:
        assert last["finished"] and "worker group 1 died" in last["error"], last
    for last, tokens, _ in ended:  # the other group's ran to the end if the machine is that fast
        assert last["finish_reason"] == "error" or (last["finish_reason"], tokens) == ("length", LONG), last
    assert len(ended) + len(running) == 4
    ended_after_s = max(at for _, at in failed) - silent_at
    print(f"started requests on the killed group ended {ended_after_s:.1f}s after it went silent")
    assert ended_after_s < 20.0  # declared dead 3 s after its last status, plus a loaded machine's delays
    for status, body in shorts:  # including those placed on the silent group: re-queued and finished
        assert status == 200 and body["count_output_tokens"] == 16, body
    f = probe.figures()
    assert f["requeued_total"] >= 1 and f["failed_total"] >= 2, f
    assert f["worker_groups"] == 1


def _take_back_a_restart(stack: Stack, probe: RouterProbe) -> None:
    """Restarted, the group takes requests again."""
    stack.start_service("worker-1")
    probe.wait_for(lambda f: f["worker_groups"] == 2, 90, "the restarted group rejoined")
    before = probe.figures()
    assert all(status == 200 for status, _ in asyncio.run(_burst(stack.url, 6, 8)))
    assert admitted(probe.figures(), "1") > admitted(before, "1")
