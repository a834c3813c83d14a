"""A hostile client against a real front end: a 200 MB chunked body is refused after at most the
limit's bytes, a thousand connections sending their headers a byte at a time neither keep
normal requests from being served within a second nor stay open past the head deadline, a
head without end is cut off, and mutated bodies on every route get a 2xx or a 4xx that says why."""

from __future__ import annotations

import asyncio
import os
import random
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration import body_fuzz
from tests.integration.conftest import start_stack
from tools.redis_server import RedisServer
from tools.stack import Stack

LIMIT = 1024 * 1024
HEAD_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def stack(tiny_llama: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    args = ["--max-body-bytes", str(LIMIT), "--header-timeout-s", str(HEAD_TIMEOUT_S)]
    s = start_stack(tiny_llama, redis_server, str(tmp_path_factory.mktemp("logs-abuse")), tokenizer_args=args)
    yield s
    s.stop()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_200mb_chunked_body_gets_413_after_at_most_the_limit(stack: Stack) -> None:
    front = stack.services["tokenizer"].proc
    assert front is not None
    rss_before = _rss_kb(front.pid)
    sock = socket.create_connection(("127.0.0.1", stack.opts.port), timeout=30)
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    sock.sendall(head)
    chunk = b"%x\r\n" % (64 * 1024) + b" " * (64 * 1024) + b"\r\n"
    sent = 0
    started = time.monotonic()
    while sent < 200 * 1024 * 1024 and not select.select([sock], [], [], 0)[0]:
        try:
            sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += 64 * 1024
    answer = sock.recv(4096)
    took = time.monotonic() - started
    sock.close()
    print(f"413 after {sent / 1024 / 1024:.1f} MB sent (socket buffers included), {took:.2f}s")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 32 * 1024 * 1024  # the limit plus what the sockets' buffers held, never the 200 MB
    assert _rss_kb(front.pid) - rss_before < 20 * 1024


def test_a_thousand_slow_heads_do_not_hold_up_normal_requests(stack: Stack) -> None:
    slow = [socket.create_connection(("127.0.0.1", stack.opts.port), timeout=10) for _ in range(1000)]
    for s in slow:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\n")  # and never the rest of the head
    opened = time.monotonic()

    async def normal() -> list[float]:
        took = []
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            for _ in range(5):
                t = time.monotonic()
                r = await client.post("/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 2}})
                assert r.status_code == 200, r.text
                took.append(time.monotonic() - t)
        return took

    took = asyncio.run(normal())
    print(f"normal requests beside 1000 slow heads: {max(took):.3f}s at most")
    assert max(took) < 1.0, took
    time.sleep(max(0.0, opened + HEAD_TIMEOUT_S + 2.0 - time.monotonic()))
    closed = sum(1 for s in slow if select.select([s], [], [], 0)[0] and s.recv(1) == b"")
    for s in slow:
        s.close()
    assert closed == len(slow)  # each closed by the front end at the head deadline


def test_a_head_without_end_is_cut_off(stack: Stack) -> None:
    sock = socket.create_connection(("127.0.0.1", stack.opts.port), timeout=10)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: ")
    sent = 0
    try:
        while sent < 50 * 1024 * 1024:
            sock.sendall(b"a" * 65536)
            sent += 65536
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.close()
    assert sent < 16 * 1024 * 1024  # closed after its first 64 KiB (and what the buffers held)


def _errors(stack: Stack) -> float:
    """The front end's count of requests answered with an error status, every route and code."""
    text = httpx.get(stack.url + "/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith("lightstream_front_request_errors_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_client_that_leaves_mid_upload_is_neither_a_500_nor_a_traceback(stack: Stack) -> None:
    log = os.path.join(stack.opts.log_dir, "tokenizer.log")
    logged = os.path.getsize(log)
    counted = _errors(stack)
    assert httpx.post(stack.url + "/generate", content=b"{", timeout=10).status_code == 400
    assert _errors(stack) == counted + 1  # an error is counted: the count below means something
    before = counted + 1
    for path in ("/generate", "/worker_generate"):
        for framing in (b"Content-Length: 100000\r\n", b"Transfer-Encoding: chunked\r\n"):
            sock = socket.create_connection(("127.0.0.1", stack.opts.port), timeout=10)
            sock.sendall(
                b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n" % (path.encode(), framing)
            )
            sock.sendall(b'400\r\n{"inputs": "half a bo' if b"chunked" in framing else b'{"inputs": "half a bo')
            time.sleep(0.2)
            sock.close()  # mid-body
    time.sleep(1.0)
    r = httpx.post(stack.url + "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 2}}, timeout=30)
    assert r.status_code == 200, r.text
    assert _errors(stack) == before
    with open(log) as f:
        f.seek(logged)
        said = f.read()
    assert "Traceback" not in said and " ERROR " not in said, said


def test_mutated_bodies_on_every_route_get_a_2xx_or_a_4xx_that_says_why(stack: Stack) -> None:
    """600 mutations of valid bodies (body_fuzz.py, a fixed seed), eight at a time, over every
    POST route: none is a 5xx or a dropped connection, every 4xx carries an error message, and
    the stack serves a plain request afterwards."""
    rng = random.Random(7)

    async def run() -> list[str]:
        wrong: list[str] = []
        gate = asyncio.Semaphore(8)
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            valid = body_fuzz.bodies(model)

            async def one(route: str, body: object, raw: str | None) -> None:
                """Sends raw as it is when given (a cut body), else body as JSON."""
                path, shown = route.split("#")[0], body if raw is None else raw
                async with gate:
                    try:
                        if raw is not None:
                            r = await client.post(path, content=raw, headers={"content-type": "application/json"})
                        else:
                            r = await client.post(path, json=body)
                    except httpx.HTTPError as e:
                        wrong.append(f"{path} {shown!r:.300}: {type(e).__name__} {e}")
                        return
                if r.status_code >= 500 or (r.status_code >= 400 and "error" not in r.text):
                    wrong.append(f"{path} {shown!r:.300}: {r.status_code} {r.text[:300]}")

            jobs = []
            for _ in range(600):
                route = rng.choice(sorted(valid))
                if rng.random() < 0.05:
                    jobs.append(one(route, None, body_fuzz.cut(valid[route], rng)))
                else:
                    jobs.append(one(route, body_fuzz.mutate(valid[route], rng), None))
            await asyncio.gather(*jobs)
            after = await client.post("/generate", json={"inputs": "still", "parameters": {"max_new_tokens": 3}})
            if after.status_code != 200:
                wrong.append(f"a plain request afterwards: {after.status_code} {after.text[:300]}")
        return wrong

    assert asyncio.run(run()) == []
