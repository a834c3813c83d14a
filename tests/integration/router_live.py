"""What the live router tests share: a tiny model with a long context, and a watch on the
router's Prometheus figures and the workers' heartbeats, polled with generous but bounded
waits (the test machine may be slow and shared)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.heartbeat import live_replicas
from shared.messages import Heartbeat
from shared.redis_link import RedisLink
from shared.streams import SERVICE_WORKER, StreamNames
from tests.integration.conftest import start_stack
from tests.polling import until
from tools import make_tiny_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack

LONG_CONTEXT = 16_384


@pytest.fixture(scope="session", name="long_llama")
def _long_llama(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Llama with a 16k-token context. A request for thousands of tokens then runs
    until its client leaves, on any machine: the tests need requests that stay in flight
    while a service is killed, and must not bet on the CPU being slow. Test modules import
    this fixture; it is built once per session, whichever module asks first."""
    path = tmp_path_factory.getbasetemp() / "tiny-llama-16k"
    if not (path / "model.safetensors").exists():
        make_tiny_model.main(
            ["--out", str(path), "--arch", "llama", "--seed", "0", "--max-positions", str(LONG_CONTEXT)]
        )
    return str(path)


Figures = dict[str, float]  # "waiting_requests", 'admitted_total{group="1"}', ... -> value


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str | Callable[[], str], every_s: float = 0.1) -> None:
    until(cond, timeout_s, what, every_s)


class RouterProbe:
    def __init__(self, metrics_port: int) -> None:
        self.url = f"http://127.0.0.1:{metrics_port}/metrics"

    def figures(self) -> Figures:
        """The router's series without their common prefix; {} while the router is down."""
        try:
            text = httpx.get(self.url, timeout=5.0).text
        except httpx.HTTPError:
            return {}
        out: Figures = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                name = s.name.removeprefix("lightstream_router_")
                # every series carries model_name (the same on all of them): keyed without it
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "model_name")
                out[f"{name}{{{labels}}}" if labels else name] = s.value
        return out

    def wait_for(self, cond: Callable[[Figures], bool], timeout_s: float, what: str) -> Figures:
        got: Figures = {}

        def check() -> bool:
            nonlocal got
            got = self.figures()
            return bool(got) and cond(got)

        wait_until(check, timeout_s, lambda: f"{what} (last figures: {got})")
        return got

    def holding(self, group: str, timeout_s: float = 30) -> Figures:
        """Until the router counts requests running on ``group`` (a fault test's moment to strike:
        a group of a few clients' load can be idle for a moment); -> the figures then."""
        key = running_key(group)
        return self.wait_for(lambda f: f.get(key, 0) > 0, timeout_s, f"requests on group {group}")


def two_groups(model_dir: str, redis_server: RedisServer, log_dir: str) -> tuple[Stack, RouterProbe]:
    """A stack of two worker groups whose router serves its metrics, and its probe, once the
    router knows both groups."""
    metrics_port = free_port()
    stack = start_stack(model_dir, redis_server, log_dir, workers=2, router_args=["--metrics-port", str(metrics_port)])
    probe = RouterProbe(metrics_port)
    try:
        probe.wait_for(lambda f: f["worker_groups"] == 2, 60, "both groups known to the router")
    except BaseException:
        stack.stop()
        raise
    return stack, probe


def running_key(group: str) -> str:
    return f'group_running_requests{{group="{group}"}}'


def admitted(f: Figures, group: str) -> float:
    return f.get(f'admitted_total{{group="{group}"}}', 0.0)


def available(info: dict) -> float:
    """A worker's free KV tokens by its heartbeat, the prompt cache's evictable ones included."""
    return info["free_tokens"] + info.get("evictable_tokens", 0)


def worker_beats(redis_url: str, namespace: str) -> dict[str, Heartbeat]:
    link = RedisLink(redis_url)
    try:
        return live_replicas(link, StreamNames(namespace), SERVICE_WORKER)
    finally:
        link.close()


async def stream_generate(
    client: httpx.AsyncClient, prompt: str, max_new: int, started: asyncio.Event
) -> tuple[dict, int, float]:
    """Stream /generate_stream to its end: (its last event, tokens seen, when it ended);
    started is set at the first token (the request has started)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    last: dict = {}
    tokens = 0
    async with client.stream("POST", "/generate_stream", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                if (last.get("token") or {}).get("id") is not None:
                    tokens += 1
                    started.set()
    return last, tokens, time.monotonic()


async def plain_generate(client: httpx.AsyncClient, prompt: str, max_new: int) -> tuple[int, dict]:
    """POST /generate: (status, body)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    r = await client.post("/generate", json=body)
    return r.status_code, r.json()
