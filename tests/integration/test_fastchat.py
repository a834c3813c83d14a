"""LightStream behind FastChat: the real controller and OpenAI API server (fschat 0.2.36)
as processes, the front end registered with the controller as a model worker, driven with
the openai package through FastChat's API server, with FastChat's test_throughput client,
and with raw worker-protocol calls; outputs compared with LightStream's own.

One stack, controller and API server for the module. The model is a tiny Llama whose end
token is not favoured (--eos-boost 0), with a long context: greedy outputs run to
max_tokens or end on its end-of-turn token, and LONG_PROMPT's runs for seconds, so that
its caller can leave it while it runs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.integration.conftest import start_stack
from tests.integration.fastchat_helpers import FastChatServer, controller_models, fastchat_python
from tests.integration.test_disconnect import Watch, _check_freed
from tests.polling import until
from tools import make_tiny_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack

MODEL, ALIAS = "lightstream-tiny", "tiny-alias"  # the names registered with FastChat
PROMPTS = ["The river was wide and calm", "Hello", "Once upon a time"]
LONG_PROMPT, LONG = "1 2 3 4 5", 4000  # no end token in 4000 greedy tokens
CONTEXT = 8192


@dataclass
class FastChat:
    stack: Stack
    controller: FastChatServer
    controller_url: str
    api_url: str
    log_dir: str
    served: str  # LightStream's own name for the model, on /v1

    def lightstream(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.stack.url + "/v1", api_key="-", max_retries=0)

    def through_fastchat(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.api_url + "/v1", api_key="-", max_retries=0)

    def worker(self, route: str, body: dict[str, Any] | None = None) -> Any:
        r = httpx.post(self.stack.url + route, json=body or {}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()


def start_controller(url: str, log_dir: str) -> FastChatServer:
    port = url.rsplit(":", 1)[1]
    return FastChatServer("fastchat.serve.controller", ["--host", "127.0.0.1", "--port", port], log_dir)


@pytest.fixture(scope="module")
def fc(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastChat]:
    model_dir = str(tmp_path_factory.mktemp("tiny-noeos"))
    make_tiny_model.main(
        ["--out", model_dir, "--arch", "llama", "--seed", "0", "--eos-boost", "0", "--max-positions", str(CONTEXT)]
    )
    log_dir = str(tmp_path_factory.mktemp("logs-fastchat"))
    fastchat_python()  # installed before anything starts
    controller_url, api_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    controller = start_controller(controller_url, log_dir)
    api = FastChatServer(
        "fastchat.serve.openai_api_server",
        ["--host", "127.0.0.1", "--port", api_url.rsplit(":", 1)[1], "--controller-address", controller_url],
        log_dir,
    )
    stack, setup = None, None
    try:
        stack = start_stack(
            model_dir,
            redis_server,
            log_dir,
            tokenizer_args=[
                "--fastchat-controller",
                controller_url,
                "--model-names",
                f"{MODEL},{ALIAS}",
                "--limit-worker-concurrency",
                "2",
                "--fastchat-heartbeat-s",
                "1",
            ],
        )
        setup = FastChat(stack, controller, controller_url, api_url, log_dir, os.path.basename(model_dir))
        controller.wait_until(lambda: MODEL in controller_models(controller_url), 30, "LightStream registered")
        api.wait_until(lambda: httpx.get(api_url + "/v1/models").status_code == 200, 30, "the API server")
        yield setup
    finally:
        api.stop()
        (setup.controller if setup else controller).stop()
        if stack is not None:
            stack.stop()


def chunks(body: bytes) -> list[dict[str, Any]]:
    """A /worker_generate_stream body: JSON objects each followed by a NUL byte."""
    assert body.endswith(b"\0")
    return [json.loads(part) for part in body.split(b"\0")[:-1]]


def no_fffd(text: str) -> str:
    return text.replace("\ufffd", "")  # FastChat's API server strips U+FFFD from streams


# ---------------------------------------------------------------- registration and the worker routes


def test_registered_under_every_name(fc: FastChat) -> None:
    assert sorted(controller_models(fc.controller_url)) == sorted([MODEL, ALIAS])
    assert sorted(m.id for m in fc.through_fastchat().models.list().data) == sorted([MODEL, ALIAS])
    assert fc.worker("/worker_get_status") == {"model_names": [MODEL, ALIAS], "speed": 1, "queue_length": 0}
    assert fc.worker("/model_details") == {"context_length": CONTEXT}
    conv = fc.worker("/worker_get_conv_template")["conv"]
    assert conv["roles"] == ["<|im_start|>user\n", "<|im_start|>assistant\n"] and conv["sep"] == "<|im_end|>\n"


def test_a_raw_stream_is_cumulative_json_chunks_with_usage_and_finish_reason(fc: FastChat) -> None:
    prompt = PROMPTS[0]
    own = fc.worker("/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 12}})
    count = fc.worker("/count_token", {"prompt": prompt})
    assert count["error_code"] == 0 and count["count"] == own["prompt_tokens"]
    body = {"model": MODEL, "prompt": prompt, "max_new_tokens": 12, "temperature": 0.0}
    r = httpx.post(fc.stack.url + "/worker_generate_stream", json=body, timeout=60)
    assert r.status_code == 200
    got = chunks(r.content)
    assert len(got) >= 3 and all(c["error_code"] == 0 for c in got)
    texts = [c["text"] for c in got]
    assert all(a == b[: len(a)] for a, b in itertools.pairwise(texts)), "the text only ever grows"
    assert texts[0].startswith(prompt), "echo is on by default"
    assert texts[-1] == prompt + own["generated_text"][0]
    # the final text is sent once more, with its finish reason
    assert texts[-2] == texts[-1] and [c["finish_reason"] for c in got[:-1]] == [None] * (len(got) - 1)
    assert got[-1]["finish_reason"] == "length"
    n = own["prompt_tokens"]
    assert got[-1]["usage"] == {"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12}
    whole = fc.worker("/worker_generate", body)
    assert whole == got[-1]
    alone = fc.worker("/worker_generate", {**body, "echo": False, "logprobs": 2})
    assert alone["text"] == own["generated_text"][0]
    lp = alone["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 12
    assert lp["text_offset"][0] == 0 and all(len(t) >= 1 for t in lp["top_logprobs"])
    best = fc.worker("/worker_generate", {**body, "temperature": 0.9, "best_of": 3})
    assert best["error_code"] == 0 and best["usage"]["completion_tokens"] <= 12
    # with echo (its default) and logprobs, the prompt's tokens come first, as FastChat's worker gives them
    scored = fc.worker("/worker_generate", {**body, "logprobs": 1})
    lp = scored["logprobs"]
    assert len(lp["tokens"]) == n + 12 and lp["token_logprobs"][0] is None and lp["text_offset"][0] == 0
    assert all(v is not None and v <= 0 for v in lp["token_logprobs"][1:])
    stream = httpx.post(fc.stack.url + "/worker_generate_stream", json={**body, "logprobs": 1}, timeout=60)
    assert chunks(stream.content)[-1]["logprobs"] == lp


def test_a_stop_string_is_cut_and_its_partial_matches_held_back(fc: FastChat) -> None:
    prompt = PROMPTS[2]
    free = fc.worker("/worker_generate", {"prompt": prompt, "max_new_tokens": 30, "temperature": 0, "echo": False})
    stop = free["text"][12:16]
    own = fc.worker("/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 30, "stop_sequences": stop}})
    body = {"prompt": prompt, "max_new_tokens": 30, "temperature": 0, "echo": False, "stop": [stop, ""]}
    got = chunks(httpx.post(fc.stack.url + "/worker_generate_stream", json=body, timeout=60).content)
    final = got[-1]
    assert final["text"] == own["generated_text"][0] and stop not in final["text"]
    assert final["finish_reason"] == "stop"
    # nothing streamed was taken back: each chunk's text is a start of the final text
    assert all(final["text"].startswith(c["text"]) for c in got)


def test_errors_are_chunks_with_fastchat_error_codes(fc: FastChat) -> None:
    def stream(body: Any) -> dict[str, Any]:
        r = httpx.post(fc.stack.url + "/worker_generate_stream", content=json.dumps(body), timeout=60)
        assert r.status_code == 200
        (chunk,) = chunks(r.content)
        return chunk

    bad = stream({"prompt": "Hello", "top_p": 2})
    assert bad["error_code"] == 40001 and "top_p" in bad["text"]
    long = stream({"prompt": "Hello", "max_new_tokens": CONTEXT})
    assert long["error_code"] == 40303 and "max_new_tokens" in long["text"]
    assert stream({"prompt": "Hello", "best_of": 2})["error_code"] == 40302
    assert stream({"prompt": "Hello", "use_beam_search": True})["error_code"] == 40001
    assert stream({"prompt": "Hello", "stop_token_ids": [10**6]})["error_code"] == 40302
    assert stream("not an object")["error_code"] == 40001
    whole = fc.worker("/worker_generate", {"prompt": "Hello", "max_new_tokens": CONTEXT})
    assert whole["error_code"] == 40303
    # FastChat's API server answers them with its 400s
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        fc.through_fastchat().completions.create(model=MODEL, prompt="Hello", max_tokens=4, presence_penalty=3.0)
    # and checks the length itself, with /count_token and /model_details
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {CONTEXT}"):
        fc.through_fastchat().completions.create(model=MODEL, prompt="Hello " * CONTEXT, max_tokens=4)


# ---------------------------------------------------------------- FastChat's API server, openai package


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completions_through_fastchat_equal_lightstreams_greedy(fc: FastChat, prompt: str) -> None:
    kw = {"prompt": prompt, "max_tokens": 40, "temperature": 0}
    own = fc.lightstream().completions.create(model=fc.served, **kw)
    got = fc.through_fastchat().completions.create(model=MODEL, **kw)
    assert got.choices[0].text == own.choices[0].text
    assert got.choices[0].finish_reason == own.choices[0].finish_reason
    assert _usage(got) == _usage(own)
    parts = list(fc.through_fastchat().completions.create(model=ALIAS, stream=True, **kw))
    assert "".join(p.choices[0].text for p in parts) == no_fffd(own.choices[0].text)
    assert parts[-1].choices[0].finish_reason == own.choices[0].finish_reason
    stop = _stop_in(own.choices[0].text)
    cut = fc.lightstream().completions.create(model=fc.served, stop=[stop], **kw)
    assert cut.choices[0].finish_reason == "stop"
    got = fc.through_fastchat().completions.create(model=MODEL, stop=[stop], **kw)
    assert got.choices[0].text == cut.choices[0].text and got.choices[0].finish_reason == "stop"
    parts = list(fc.through_fastchat().completions.create(model=MODEL, stop=stop, stream=True, **kw))
    assert "".join(p.choices[0].text for p in parts) == no_fffd(cut.choices[0].text)
    assert parts[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("system", [None, "Answer in one word."])
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_chat_through_fastchat_equals_lightstreams_greedy(fc: FastChat, prompt: str, system: str | None) -> None:
    """FastChat renders the chat with the template /worker_get_conv_template gives, read off
    the model's: equal to LightStream's chat of the same conversation. This model's template
    writes no system block when there is no system message, FastChat's always does, so
    FastChat's chat without one is LightStream's with an empty one."""
    turns = [{"role": "user", "content": prompt}]
    sent = turns if system is None else [{"role": "system", "content": system}, *turns]
    rendered = [{"role": "system", "content": system or ""}, *turns]
    own = fc.lightstream().chat.completions.create(model=fc.served, messages=rendered, max_tokens=40, temperature=0)
    got = fc.through_fastchat().chat.completions.create(model=MODEL, messages=sent, max_tokens=40, temperature=0)
    assert got.choices[0].message.content == own.choices[0].message.content
    assert got.choices[0].finish_reason == own.choices[0].finish_reason
    assert got.usage.prompt_tokens == own.usage.prompt_tokens
    assert got.usage.completion_tokens == own.usage.completion_tokens
    parts = list(
        fc.through_fastchat().chat.completions.create(
            model=MODEL, messages=sent, max_tokens=40, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].delta.content or "" for p in parts) == no_fffd(own.choices[0].message.content)
    assert parts[-1].choices[0].finish_reason == own.choices[0].finish_reason


def test_fastchats_test_throughput_client_parses_the_stream(fc: FastChat) -> None:
    """Four threads on two slots: two wait their turn."""
    args = ["--controller-address", fc.controller_url, "--model-name", MODEL]
    args += ["--max-new-tokens", "16", "--n-thread", "4"]
    r = subprocess.run(
        [fastchat_python(), "-m", "fastchat.serve.test_throughput", *args],
        cwd=fc.log_dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "throughput:" in r.stdout, r.stdout + r.stderr
    assert "Exception" not in r.stderr, r.stderr


# ---------------------------------------------------------------- callers that leave, slots


# callers as processes, to be killed: python -c SCRIPT URL MODEL PROMPT MAX_TOKENS
RAW_STREAM = """
import httpx, sys
body = {"prompt": sys.argv[3], "max_new_tokens": int(sys.argv[4]), "temperature": 0}
with httpx.stream("POST", sys.argv[1] + "/worker_generate_stream", json=body, timeout=60) as r:
    for chunk in r.iter_raw():
        print("chunk", flush=True)
"""
RAW_WHOLE = """
import httpx, sys
print("chunk", flush=True)
body = {"prompt": sys.argv[3], "max_new_tokens": int(sys.argv[4]), "temperature": 0}
httpx.post(sys.argv[1] + "/worker_generate", json=body, timeout=60)
"""
API_STREAM = """
import openai, sys
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="-", max_retries=0)
kw = {"prompt": sys.argv[3], "max_tokens": int(sys.argv[4]), "temperature": 0, "stream": True}
for part in client.completions.create(model=sys.argv[2], **kw):
    print("chunk", flush=True)
"""


@pytest.mark.parametrize("caller", ["raw stream", "raw whole", "API server stream"])
def test_killing_the_caller_frees_the_kv_within_a_step(fc: FastChat, caller: str) -> None:
    script, url = {
        "raw stream": (RAW_STREAM, fc.stack.url),
        "raw whole": (RAW_WHOLE, fc.stack.url),
        "API server stream": (API_STREAM, fc.api_url),
    }[caller]
    watch = Watch(fc.stack)
    proc = subprocess.Popen([sys.executable, "-c", script, url, MODEL, LONG_PROMPT, str(LONG)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"chunk\n"
        rid = until(watch.rid, 10, "the request reached the router")
        until(lambda: watch.holding(rid), 10, "the worker is generating")
        proc.send_signal(signal.SIGKILL)
        left_at = time.time()
    finally:
        proc.kill()
        proc.wait()
    until(watch.free, 3, "the worker's KV tokens are all free")
    time.sleep(0.1)  # a step that was to come would have come by now
    _check_freed(watch, rid, left_at)
    until(lambda: fc.worker("/worker_get_status")["queue_length"] == 0, 3, "the slot released")


def test_slots_are_released_on_every_exit_path(fc: FastChat) -> None:
    """Two slots: two long streams hold them, a third request waits (and counts as queued),
    its caller leaves, the streams' callers leave; then three requests at once all finish,
    which they would not if any exit path of the tests before had kept a slot."""

    async def run() -> None:
        async with httpx.AsyncClient(base_url=fc.stack.url, timeout=60) as http:
            long = {"prompt": LONG_PROMPT, "max_new_tokens": LONG, "temperature": 0}
            streams = [http.stream("POST", "/worker_generate_stream", json=long) for _ in range(2)]
            for s in streams:
                await s.__aenter__()
            await _until_async(lambda: _queue(fc) == 2, "two generating")
            waiting = asyncio.create_task(http.post("/worker_generate", json=long))
            await _until_async(lambda: _queue(fc) == 3, "one more waiting for a slot")
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await _until_async(lambda: _queue(fc) == 2, "the waiting caller gone")
            for s in streams:
                await s.__aexit__(None, None, None)
            await _until_async(lambda: _queue(fc) == 0, "the streams' callers gone")
            short = {"prompt": "Hello", "max_new_tokens": 4, "temperature": 0}
            done = await asyncio.wait_for(
                asyncio.gather(*(http.post("/worker_generate", json=short) for _ in range(3))), 30
            )
            assert [r.json()["usage"]["completion_tokens"] for r in done] == [4, 4, 4]
            assert _queue(fc) == 0

    asyncio.run(run())


def test_registers_again_with_a_controller_that_forgot_it(fc: FastChat) -> None:
    fc.controller.stop(signal.SIGKILL)
    fc.controller = start_controller(fc.controller_url, fc.log_dir)  # on the same address, knowing no worker
    fc.controller.wait_until(lambda: MODEL in controller_models(fc.controller_url), 15, "registered again")
    got = fc.through_fastchat().completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    assert got.usage.completion_tokens == 4


# ---------------------------------------------------------------- helpers


def _usage(response: Any) -> tuple[int, int, int]:
    u = response.usage
    return u.prompt_tokens, u.completion_tokens, u.total_tokens


def _stop_in(text: str) -> str:
    """Three characters from the middle of text, none of them U+FFFD."""
    starts = [i for i in range(8, len(text) - 3) if "\ufffd" not in text[i : i + 3]]
    assert starts, f"no stop string to take from {text!r}"
    return text[starts[0] : starts[0] + 3]


def _queue(fc: FastChat) -> int:
    return httpx.post(fc.stack.url + "/worker_get_status", timeout=10).json()["queue_length"]


async def _until_async(check: Any, what: str, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s}s: {what}")
