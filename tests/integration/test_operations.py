"""What operators rely on, against the whole stack under an API key: /readiness (200 when up,
503 without a live worker group), /version, /tokenize and /detokenize in vLLM's shapes
with the Hugging Face tokenizer's tokens, /metrics without the key, and SIGTERM's drain:
streams in flight finish, readiness and new requests answer 503 meanwhile, streams past
the drain timeout end with an error event, and the front end exits 0."""

from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import time
import tomllib
from collections.abc import Iterator

import httpx
import pytest

from tests import hf_reference
from tests.integration.conftest import start_stack
from tests.integration.router_live import _long_llama  # noqa: F401 (a fixture)
from tools.redis_server import RedisServer
from tools.stack import Stack

KEY = "ops-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = "The river was wide and calm, and the boats went slowly down to the sea."
DRAIN_S = 60  # the drain timeout: far more than the drained streams need
STREAM_S = 4.0  # about how long each of the drained streams runs, at this machine's speed
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def stack(long_llama: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(
        long_llama,
        redis_server,
        str(tmp_path_factory.mktemp("logs-operations")),
        tokenizer_args=["--api-key", KEY],
        env={"LS_DRAIN_TIMEOUT_S": str(DRAIN_S)},
    )
    yield s
    s.stop()


def _client(stack: Stack, **kw) -> httpx.Client:
    return httpx.Client(base_url=stack.url, timeout=30, **kw)


def _ready_within(stack: Stack, want: int, timeout_s: float) -> httpx.Response:
    end = time.monotonic() + timeout_s
    while True:
        r = httpx.get(stack.url + "/readiness", timeout=5)
        if r.status_code == want or time.monotonic() > end:
            return r
        time.sleep(0.2)


def test_readiness_is_200_when_up_and_503_without_a_worker(stack: Stack) -> None:
    r = httpx.get(stack.url + "/readiness", timeout=5)  # no key: probes carry none
    assert (r.status_code, r.json()) == (200, {"status": "ready"})
    stack.signal_service("worker-0", signal.SIGSTOP)  # its heartbeat goes stale
    try:
        r = _ready_within(stack, 503, 15)
        assert r.status_code == 503
        assert r.json() == {"status": "unavailable", "reasons": ["no worker group is alive"]}
        # liveness is the process's own: no worker is no reason to restart the front end
        assert httpx.get(stack.url + "/liveness", timeout=5).json() == {"status": "alive"}
    finally:
        stack.signal_service("worker-0", signal.SIGCONT)
    assert _ready_within(stack, 200, 15).status_code == 200


def test_version_names_the_package_and_the_model(stack: Stack) -> None:
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with _client(stack, headers=AUTH) as c:
        assert c.get("/version").json() == {"version": want, "model": pathlib.Path(stack.opts.model_dir).name}
    assert httpx.get(stack.url + "/version").status_code == 401  # behind the key like the rest


def test_metrics_are_open_without_the_key(stack: Stack) -> None:
    r = httpx.get(stack.url + "/metrics", timeout=10)
    assert r.status_code == 200 and "lightstream" in r.text
    assert httpx.post(stack.url + "/generate", json={"inputs": "x"}).status_code == 401


def test_openapi_lists_every_route_those_outside_fastapi_too(stack: Stack) -> None:
    with _client(stack, headers=AUTH) as c:
        paths = c.get("/openapi.json").json()["paths"]
        assert c.get("/docs").status_code == 200
    generating = ["/generate", "/generate_stream", "/", "/v1/completions", "/v1/chat/completions", "/v1/messages"]
    generating += ["/worker_generate", "/worker_generate_stream"]
    assert all("post" in paths[p] for p in generating), sorted(paths)
    fastapis = {"/health", "/readiness", "/version", "/tokenize", "/detokenize", "/v1/models", "/info"}
    assert fastapis | {"/v1/messages/count_tokens"} <= set(paths)


def test_tokenize_and_detokenize_give_the_hf_tokenizers_tokens(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.opts.model_dir)
    chat_text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    bare_chat = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=False)
    begun = [*CHAT, {"role": "assistant", "content": "Once upon"}]
    open_chat = tok.apply_chat_template(begun, tokenize=False, continue_final_message=True)
    cases = [
        ({"prompt": PROMPT}, tok(PROMPT)["input_ids"]),
        ({"prompt": PROMPT, "add_special_tokens": False}, tok(PROMPT, add_special_tokens=False)["input_ids"]),
        ({"messages": CHAT}, tok(chat_text, add_special_tokens=False)["input_ids"]),
        ({"messages": CHAT, "add_generation_prompt": False}, tok(bare_chat, add_special_tokens=False)["input_ids"]),
        (
            {"messages": begun, "add_generation_prompt": False, "continue_final_message": True},
            tok(open_chat, add_special_tokens=False)["input_ids"],
        ),
    ]
    with _client(stack, headers=AUTH) as c:
        max_len = c.get("/v1/models").json()["data"][0]["max_model_len"]
        for body, want in cases:
            got = c.post("/tokenize", json=body)
            assert got.status_code == 200, got.text
            assert got.json() == {"count": len(want), "max_model_len": max_len, "tokens": want}, body
        strs = c.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()["token_strs"]
        assert strs == tok.convert_ids_to_tokens(tok(PROMPT)["input_ids"])
        ids = tok(PROMPT)["input_ids"]
        got = c.post("/detokenize", json={"tokens": ids, "model": pathlib.Path(stack.opts.model_dir).name})
        assert got.json() == {"prompt": tok.decode(ids)}


@pytest.mark.parametrize(
    ("path", "body", "status", "names"),
    [
        ("/tokenize", {}, 400, "prompt or messages"),
        ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "not both"),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "bogus": 1}, 400, "bogus: unknown parameter"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"prompt": "a", "model": "nope"}, 404, "'nope' does not exist"),
        ("/detokenize", {"tokens": [1, -1]}, 400, "tokens: token ids must be in"),
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens: token ids must be in"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("/detokenize", {}, 400, "tokens: required"),
    ],
)
def test_bad_tokenize_bodies_get_a_4xx_naming_the_problem(
    stack: Stack, path: str, body: dict, status: int, names: str
) -> None:
    with _client(stack, headers=AUTH) as c:
        r = c.post(path, json=body)
    assert r.status_code == status, r.text
    assert names in r.json()["error"]


async def _stream(url: str, body: dict, events: list[dict]) -> None:
    async with (
        httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as c,
        c.stream("POST", "/generate_stream", json=body) as r,
    ):
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))


async def _until_streaming(streams: list[list[dict]], tasks: list[asyncio.Task]) -> None:
    while not all(streams):
        assert not any(t.done() for t in tasks), "a stream ended before the drain began"
        await asyncio.sleep(0.05)


def _drain_checks(stack: Stack) -> tuple[httpx.Response, httpx.Response]:
    """Readiness and a new request during the drain; liveness stays 200 (an orchestrator must
    not kill a draining front end)."""
    ready = _ready_within(stack, 503, 5)
    assert httpx.get(stack.url + "/liveness", timeout=5).status_code == 200
    refused = httpx.post(stack.url + "/generate", json={"inputs": "x"}, headers=AUTH, timeout=10)
    return ready, refused


def _tokens_for(stack: Stack, seconds: float) -> int:
    """Output tokens a lone request gets in about this long here (the CPU may be shared)."""
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 32, "ignore_eos": True}}
    start = time.monotonic()
    assert httpx.post(stack.url + "/generate", json=body, headers=AUTH, timeout=60).status_code == 200
    return max(20, min(2000, int(32 * seconds / (time.monotonic() - start))))


def test_sigterm_drains_the_streams_in_flight_then_exits_0(stack: Stack) -> None:
    n = _tokens_for(stack, STREAM_S)  # three at once take longer than one: the drain has them in flight
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": n, "ignore_eos": True}}

    async def run() -> tuple[list[list[dict]], httpx.Response, httpx.Response, float]:
        streams: list[list[dict]] = [[], [], []]
        tasks = [asyncio.create_task(_stream(stack.url, body, s)) for s in streams]
        await _until_streaming(streams, tasks)
        signalled = time.monotonic()
        stack.signal_service("tokenizer", signal.SIGTERM)
        ready, refused = await asyncio.to_thread(_drain_checks, stack)
        assert not all(t.done() for t in tasks), "the streams ended before the drain was seen"
        await asyncio.gather(*tasks)
        return streams, ready, refused, time.monotonic() - signalled

    streams, ready, refused, took = asyncio.run(run())
    assert ready.status_code == 503 and ready.json()["status"] == "draining", ready.text
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
    assert "shutting down" in refused.json()["error"]
    for events in streams:
        assert [e["finish_reason"] for e in events[-1:]] == ["length"]
        assert sum(1 for e in events if e["token"]["id"] >= 0) == n
    assert took < DRAIN_S
    assert stack.services["tokenizer"].proc.wait(15) == 0


def test_streams_past_the_drain_timeout_end_with_an_error_event(stack: Stack) -> None:
    if stack.services["tokenizer"].proc.poll() is None:
        stack.kill_service("tokenizer", signal.SIGTERM)
    stack.opts.env["LS_DRAIN_TIMEOUT_S"] = "1"
    stack.start_service("tokenizer")
    stack.wait_ready(timeout_s=120)
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10_000, "ignore_eos": True}}

    async def run() -> list[dict]:
        events: list[dict] = []
        task = asyncio.create_task(_stream(stack.url, body, events))
        await _until_streaming([events], [task])
        stack.signal_service("tokenizer", signal.SIGTERM)
        await asyncio.wait_for(task, 20)
        return events

    events = asyncio.run(run())
    assert events[-1]["finish_reason"] == "error" and "drain timeout" in events[-1]["error"]
    assert stack.services["tokenizer"].proc.wait(15) == 0
