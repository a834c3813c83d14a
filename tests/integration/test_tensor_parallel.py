"""Tensor parallelism on the CPU (gloo): a worker group of two ranks behind the real services.

TP=2 greedy output equals Hugging Face's (which the TP=1 stack is held to elsewhere, so the
two equal each other), for four tiny models (Gemma's norms after the all-reduces, its head
norms and windows on each rank's share of the heads); a rank killed under load ends its group's
requests with an explicit error within 10 seconds, and the restarted group serves again.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time

import httpx
import pytest

from tests import hf_reference
from tests.conftest import MOE_ARCHS
from tests.integration.conftest import start_stack
from tools.redis_server import RedisServer
from tools.stack import Stack

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over the lazy dog.",
    "你好，世界！",
    "def f(x): return x +",
    "Once upon a time there was a small town by the sea. " * 3,
]
TP2 = ["--tp", "2"]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2", "gemma3", "qwen3_moe"])
def tp_stack(request: pytest.FixtureRequest, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory):
    models = "tiny_moe_models" if request.param in MOE_ARCHS else "tiny_models"
    model_dir = request.getfixturevalue(models)[request.param]
    s = start_stack(model_dir, redis_server, str(tmp_path_factory.mktemp("tp-logs")), worker_args=TP2)
    s.model_dir = model_dir  # type: ignore[attr-defined]
    yield s
    s.stop()


def test_tp2_greedy_equals_hf(tp_stack: Stack) -> None:
    tok = hf_reference.tokenizer(tp_stack.model_dir)

    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=tp_stack.url, timeout=120) as client:
            bodies = [
                {"inputs": p, "parameters": {"max_new_tokens": 6 + 5 * i, "return_details": True}}
                for i, p in enumerate(PROMPTS)
            ]
            resps = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
            return [r.json() for r in resps]

    for i, (prompt, body) in enumerate(zip(PROMPTS, asyncio.run(run()), strict=True)):
        want = hf_reference.greedy(tp_stack.model_dir, tok(prompt)["input_ids"], 6 + 5 * i)
        assert [t["id"] for t in body["tokens"]] == want, prompt


def _follower_pids(stack: Stack) -> list[int]:
    proc = stack.services["worker-0"].proc
    assert proc is not None
    # the ranks, not the resource tracker that multiprocessing also starts
    out = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "spawn_main"], capture_output=True, text=True
    ).stdout.split()
    return [int(p) for p in out]


def test_a_rank_killed_under_load_fails_its_requests_and_the_group_comes_back(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    stack = start_stack(tiny_llama, redis_server, str(tmp_path), worker_args=TP2)
    try:

        async def one(client: httpx.AsyncClient, started: asyncio.Event) -> tuple[dict, float]:
            """The last event of the stream; a request that failed before its first token is
            answered with an error status and body instead."""
            body = {"inputs": "The river was wide and calm.", "parameters": {"max_new_tokens": 900, "ignore_eos": True}}
            last: dict = {}
            async with client.stream("POST", "/generate_stream", json=body) as r:
                if r.status_code != 200:
                    error = json.loads(await r.aread())["error"]
                    return {"finished": True, "finish_reason": "error", "error": error, "status": r.status_code}, (
                        time.monotonic()
                    )
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        last = json.loads(line[6:])
                        started.set()
            return last, time.monotonic()

        async def scenario() -> tuple[list, float]:
            async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
                started = asyncio.Event()
                tasks = [asyncio.create_task(one(client, started)) for _ in range(3)]
                await asyncio.wait_for(started.wait(), 60)
                followers = _follower_pids(stack)
                assert followers, "the worker has no tensor-parallel rank to kill"
                subprocess.run(["kill", f"-{signal.SIGKILL}", str(followers[0])], check=True)
                killed = time.monotonic()
                return await asyncio.gather(*tasks), killed

        results, killed = asyncio.run(scenario())
        for last, ended in results:
            assert last["finished"] and last["finish_reason"] == "error", last
            # rank 0 learns of the death from its watchdog or from the collective that fails; when the
            # group goes down before its error reaches the client (a loaded machine), the front end's
            # watchdog ends the request, seeing no worker's heartbeat: explicit either way
            reasons = ("rank died", "the worker failed", "no worker is alive")
            assert any(why in last["error"] for why in reasons), last
            assert ended - killed < 10.0
        worker = stack.services["worker-0"].proc
        assert worker is not None and worker.wait(15) != 0  # the group went down as a whole
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            deadline = time.monotonic() + 15  # until the dead group's last heartbeat is stale
            while client.get("/health").status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.2)
        stack.start_service("worker-0")
        stack.wait_ready(timeout_s=120)
        with httpx.Client(base_url=stack.url, timeout=60) as client:
            r = client.post("/generate", json={"inputs": "back again", "parameters": {"max_new_tokens": 5}})
            assert r.status_code == 200 and r.json()["count_output_tokens"] >= 1, r.text
    finally:
        stack.stop()


def test_tp2_prompt_cache_reuse_equals_hf(tp_stack: Stack) -> None:
    """Prompts that extend or cut a cached one: every rank must read the cached prefix's slots
    through rows that only rank 0's cache wrote (tp/channel.py carries those writes)."""
    tok = hf_reference.tokenizer(tp_stack.model_dir)
    base = PROMPTS[-1]
    prompts = [base, base + "and then the boats came back", base[:20] + " xyz", base]

    with httpx.Client(base_url=tp_stack.url, timeout=120) as client:
        for prompt in prompts:  # one at a time: each finds the ones before it cached
            body = {"inputs": prompt, "parameters": {"max_new_tokens": 5, "ignore_eos": True, "return_details": True}}
            r = client.post("/generate", json=body)
            assert r.status_code == 200, r.text
            want = hf_reference.greedy(tp_stack.model_dir, tok(prompt)["input_ids"], 5, eos=False)
            assert [t["id"] for t in r.json()["tokens"]] == want, prompt
