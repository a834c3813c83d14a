"""The drain without processes: its gate refuses generations with 503 and Retry-After while
draining and counts them in flight otherwise; its wait ends when they are done, or fails what
is left at the deadline; the pipeline ends every generation with an error item; /metrics is
open under API keys unless protect_metrics; and the settings' flags and variables."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.tokenizer.drain import Drain, DrainGate
from services.tokenizer.gates import Gates, open_paths
from services.tokenizer.pipeline import PendingRequest, Pipeline
from shared.cli import parse_config
from shared.config import ConfigError, TokenizerConfig
from shared.messages import FINISH_ERROR, TextItem
from shared.redis_link import RedisLink
from shared.streams import StreamNames
from tools.redis_server import RedisServer


async def _call(app: Any, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> tuple[int, dict, Any]:
    """(status, headers, JSON body) of one request to an ASGI app."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], dict(sent[0]["headers"]), json.loads(body)


class Inner:
    """The app behind the gate: answers 200 and notes how many requests were in flight."""

    def __init__(self, drain: Drain) -> None:
        self.drain = drain
        self.seen: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append(self.drain.in_flight)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def test_the_gate_counts_generations_and_refuses_them_while_draining() -> None:
    drain = Drain(timeout_s=5)
    inner = Inner(drain)
    gate = DrainGate(inner, drain, paths={"/generate", "/v1/completions"})
    assert asyncio.run(_call(gate, "/generate"))[0] == 200
    assert asyncio.run(_call(gate, "/tokenize"))[0] == 200
    assert inner.seen == [1, 0] and drain.in_flight == 0
    drain.begin()
    status, headers, body = asyncio.run(_call(gate, "/generate"))
    assert (status, headers[b"retry-after"]) == (503, b"1")
    assert body["error_type"] == "unavailable" and "shutting down" in body["error"]
    status, _, body = asyncio.run(_call(gate, "/v1/completions"))
    assert status == 503 and body["error"]["type"] == "server_error"  # OpenAI's shape under /v1
    assert asyncio.run(_call(gate, "/readiness"))[0] == 200  # the rest is still served
    assert len(inner.seen) == 3


def _run_drain(drain: Drain, in_flight: int, finish_after_s: float | None) -> tuple[list[str], list[bool]]:
    failed: list[str] = []
    stopped: list[bool] = []

    def fail(why: str) -> int:
        failed.append(why)
        drain.in_flight = 0  # the error events went out
        return 1

    async def run() -> None:
        drain.in_flight = in_flight
        drain.begin()
        if finish_after_s is not None:
            asyncio.get_running_loop().call_later(finish_after_s, lambda: setattr(drain, "in_flight", 0))
        await drain.run(fail, lambda: stopped.append(True))

    asyncio.run(run())
    return failed, stopped


def test_the_drain_waits_for_the_requests_then_stops() -> None:
    assert _run_drain(Drain(timeout_s=5), 2, finish_after_s=0.2) == ([], [True])
    assert _run_drain(Drain(timeout_s=5), 0, finish_after_s=None) == ([], [True])


def test_the_drain_fails_what_is_left_at_its_deadline() -> None:
    failed, stopped = _run_drain(Drain(timeout_s=0.2), 1, finish_after_s=None)
    assert stopped == [True] and len(failed) == 1 and "drain timeout of 0.2 s" in failed[0]


def test_a_second_signal_ends_the_wait() -> None:
    drain = Drain(timeout_s=60)

    async def run() -> list[str]:
        failed: list[str] = []
        drain.in_flight = 1
        drain.begin()
        asyncio.get_running_loop().call_later(0.1, drain.hurry)  # what DrainingServer does on a second signal
        await asyncio.wait_for(drain.run(lambda why: failed.append(why) or 0, lambda: None), 10)
        return failed

    assert len(asyncio.run(run())) == 1


def test_the_pipeline_ends_every_generation_with_an_error_item(redis_server: RedisServer) -> None:
    p = Pipeline(RedisLink(redis_server.url), StreamNames("t"), "front-0", 100, 3.0, 1.0)
    aborted: list[str] = []
    p.abort = lambda rid, reason: aborted.append(rid)  # type: ignore[method-assign]

    async def run() -> list[tuple[int, TextItem]]:
        queue: asyncio.Queue[tuple[int, TextItem]] = asyncio.Queue()
        for i, rid in enumerate(["a", "b"]):
            p.pending[rid] = PendingRequest(rid, "d0", 7, queue, i)
        assert p.fail_all("shutting down") == 2
        return [queue.get_nowait() for _ in range(2)]

    items = asyncio.run(run())
    assert [(i, t.rid, t.finish_reason, t.error, t.prompt_tokens) for i, t in items] == [
        (0, "a", FINISH_ERROR, "shutting down", 7),
        (1, "b", FINISH_ERROR, "shutting down", 7),
    ]
    assert aborted == ["a", "b"]


@pytest.mark.parametrize(("protect", "status"), [(False, 200), (True, 401)])
def test_metrics_are_open_under_api_keys_unless_protected(protect: bool, status: int) -> None:
    gates = Gates(Inner(Drain(1)), 1024, ("k",), open_paths(protect))
    assert asyncio.run(_call(gates, "/metrics"))[0] == status
    assert asyncio.run(_call(gates, "/readiness"))[0] == 200
    assert asyncio.run(_call(gates, "/liveness"))[0] == 200
    assert asyncio.run(_call(gates, "/version"))[0] == 401
    assert asyncio.run(_call(gates, "/version", [(b"authorization", b"Bearer k")]))[0] == 200


def test_drain_and_metrics_settings() -> None:
    cfg = parse_config(TokenizerConfig, ["--model-dir", "m"], {})
    assert (cfg.drain_timeout_s, cfg.protect_metrics) == (30.0, False)
    cfg = parse_config(TokenizerConfig, ["--model-dir", "m", "--drain-timeout-s", "5", "--protect-metrics", "true"], {})
    assert (cfg.drain_timeout_s, cfg.protect_metrics) == (5.0, True)
    env = {"LS_DRAIN_TIMEOUT_S": "0", "LS_PROTECT_METRICS": "1"}
    cfg = parse_config(TokenizerConfig, ["--model-dir", "m"], env)
    assert (cfg.drain_timeout_s, cfg.protect_metrics) == (0.0, True)
    with pytest.raises(ConfigError, match="drain_timeout_s"):
        TokenizerConfig(model_dir="m", drain_timeout_s=-1)
