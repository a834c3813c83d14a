"""A tiny LLaVA through the whole stack (front end, visual replica, router, worker,
detokenizer): greedy answers with one and two images of different sizes equal Hugging Face's,
through /v1/chat/completions (the openai client, data URLs), /generate (multimodal_params) and
FastChat's /worker_generate; an image sent again is encoded once; text alone still works; bad
images get a 4xx naming the problem."""

from __future__ import annotations

import base64
import concurrent.futures
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests import vision_cases as vc
from tests.integration.conftest import start_stack
from tests.integration.vision_helpers import b64, cache_counts, chat_content, data_url, hf_chat_text, hf_generate_text
from tests.polling import until
from tools import benchmark_serving
from tools.redis_server import free_port
from tools.stack import Stack

MAX_NEW = 10
ONE = [vc.image(11, 60, 40)]
TWO = [vc.image(12, 23, 70), vc.image(13, 48, 48)]
MAX_IMAGE_BYTES = 20_000
MAX_PIXELS = 300 * 300


@pytest.fixture(scope="module")
def stack(tiny_llava: str, redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    metrics_port = free_port()
    front = ["--model-name", "tiny-llava", "--max-images-per-request", "2", "--max-image-bytes", str(MAX_IMAGE_BYTES)]
    front += ["--max-image-pixels", str(MAX_PIXELS), "--allowed-image-domains", "images.example.org"]
    s = start_stack(
        tiny_llava,
        redis_server,
        str(tmp_path_factory.mktemp("logs-vision")),
        tokenizer_args=front,
        worker_args=["--batch-max-tokens", "24"],  # prompts go in chunks that cut through images
        visual_args=["--metrics-port", str(metrics_port)],
    )
    s.model_dir = tiny_llava  # type: ignore[attr-defined]
    s.visual_metrics = f"http://127.0.0.1:{metrics_port}"  # type: ignore[attr-defined]
    yield s
    s.stop()


def _client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.mark.parametrize("images", [ONE, TWO], ids=["one", "two"])
def test_chat_with_images_equals_hf(stack: Stack, images) -> None:
    text = "What is in the picture?"
    r = _client(stack).chat.completions.create(
        model="tiny-llava",
        messages=[{"role": "user", "content": chat_content(text, images)}],
        max_tokens=MAX_NEW,
        temperature=0,
    )
    assert r.choices[0].message.content == hf_chat_text(stack.model_dir, text, images, MAX_NEW)
    assert r.usage.prompt_tokens > 16 * len(images)  # the images' positions count as prompt tokens


@pytest.mark.parametrize("images", [ONE, TWO], ids=["one", "two"])
def test_generate_with_multimodal_params_equals_hf(stack: Stack, images) -> None:
    prompt = "<image>" * len(images) + "Describe it."
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": MAX_NEW},
        "multimodal_params": {"images": [{"type": "base64", "data": b64(i)} for i in images]},
    }
    r = httpx.post(stack.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"][0] == hf_generate_text(stack.model_dir, prompt, images, MAX_NEW)


def test_fastchat_worker_with_images_equals_hf(stack: Stack) -> None:
    prompt = "<image>Describe it."
    body = {"prompt": prompt, "images": [data_url(ONE[0])], "max_new_tokens": MAX_NEW, "temperature": 0, "echo": False}
    r = httpx.post(stack.url + "/worker_generate", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["error_code"] == 0, r.text
    assert r.json()["text"] == hf_generate_text(stack.model_dir, prompt, ONE, MAX_NEW)


def test_an_image_sent_again_is_encoded_once(stack: Stack) -> None:
    image = vc.image(99, 31, 57)  # sent by no other test
    hits, misses = cache_counts(stack.visual_metrics)
    for _ in range(2):
        body = {"inputs": "<image>Again?", "parameters": {"max_new_tokens": 2},
                "multimodal_params": {"images": [{"type": "base64", "data": b64(image)}]}}  # fmt: skip
        assert httpx.post(stack.url + "/generate", json=body, timeout=60).status_code == 200
    assert cache_counts(stack.visual_metrics) == (hits + 1, misses + 1)


def test_text_alone_to_a_vision_model(stack: Stack) -> None:
    prompt = "The quick brown fox"
    r = httpx.post(stack.url + "/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW}})
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"][0] == hf_generate_text(stack.model_dir, prompt, [], MAX_NEW)


def _png_of(width: int, height: int) -> bytes:
    return vc.png(vc.image(5, width, height))


BAD_CHAT = [  # (image URL, status, words the message has)
    ("data:image/png;base64,!!!not base64!!!", 400, "not valid base64"),
    ("data:image/png;base64," + base64.b64encode(_png_of(40, 40)[:-40]).decode(), 400, "cannot be decoded"),
    ("data:text/plain;base64,aGVsbG8gd29ybGQ=", 400, "not an image"),
    ("/etc/passwd", 400, "only data:, http: and https:"),
    ("file:///etc/passwd", 400, "only data:, http: and https:"),
    ("http://evil.example.com/cat.png", 400, "not allowed"),
]


@pytest.mark.parametrize(("url", "status", "words"), BAD_CHAT, ids=[b[2] + str(i) for i, b in enumerate(BAD_CHAT)])
def test_a_bad_image_is_a_4xx_naming_it(stack: Stack, url: str, status: int, words: str) -> None:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]
    body = {"model": "tiny-llava", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["param"] == "messages.0.content.0.image_url"


def test_images_over_the_limits_are_refused(stack: Stack) -> None:
    def generate(images: list[str], prompt: str = "<image>hi", max_new: int = 2) -> httpx.Response:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new},
                "multimodal_params": {"images": [{"type": "base64", "data": d} for d in images]}}  # fmt: skip
        return httpx.post(stack.url + "/generate", json=body, timeout=30)

    big = base64.b64encode(_png_of(200, 200) + bytes(MAX_IMAGE_BYTES)).decode()  # a PNG with trailing bytes
    r = generate([big])
    assert r.status_code == 413 and "over the limit" in r.json()["error"] and "bytes" in r.json()["error"]
    wide = base64.b64encode(vc.png(vc.image(0, 400, 400).convert("1"))).decode()  # small file, many pixels
    r = generate([wide])
    assert r.status_code == 413 and "pixels" in r.json()["error"]
    small = b64(ONE[0])
    r = generate([small] * 3, "<image>" * 3)
    assert r.status_code == 400 and "over the limit of 2" in r.json()["error"]
    r = generate([small, small], "<image>hi")
    assert r.status_code == 400 and "2 images given, but the prompt has 1 <image>" in r.json()["error"]
    r = generate([small], "<image>hi", max_new=1024)
    assert r.status_code == 400 and "of them its images'" in r.json()["error"]
    assert generate([small]).status_code == 200  # and it still serves


def test_benchmark_serving_sends_image_requests(stack: Stack, tmp_path) -> None:
    hits, misses = cache_counts(stack.visual_metrics)
    argv = ["--url", stack.url, "--out", str(tmp_path / "bench.json"), "--requests", "1", "--vocab", "1000"]
    argv += ["--images-per-request", "1", "--image-size", "64", "--tokenizer", stack.model_dir, "--quiet"]
    (r,) = benchmark_serving.main(argv)
    assert r["completed"] == 1 and r["failed"] == 0 and r["images_per_request"] == 1, r["errors"]
    assert r["output_tok_per_s"] > 0 and 0 < r["ttft_ms"]["median"] <= r["e2e_ms"]["median"]
    assert cache_counts(stack.visual_metrics) == (hits, misses + 1)  # a synthetic image no test sent before


def test_visual_killed_with_requests_waiting_then_restarted(stack: Stack) -> None:
    """Runs last: requests waiting for a frozen visual replica end with an explicit error within
    10 s of its death; once it is back, image requests succeed again."""

    def ask(seed: int) -> httpx.Response:
        body = {"inputs": "<image>hi", "parameters": {"max_new_tokens": 2},
                "multimodal_params": {"images": [{"type": "base64", "data": b64(vc.image(seed, 20, 30))}]}}  # fmt: skip
        return httpx.post(stack.url + "/generate", json=body, timeout=60)

    stack.signal_service("visual-0", signal.SIGSTOP)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        waiting = [pool.submit(ask, 200 + i) for i in range(3)]
        time.sleep(1.0)
        assert not any(f.done() for f in waiting)  # they wait in the visual stream
        stack.kill_service("visual-0")
        killed = time.monotonic()
        answers = [f.result() for f in waiting]
    assert time.monotonic() - killed < 10
    for r in answers:
        assert r.status_code == 500 and "visual" in r.json()["error"], r.text
    reason = "no visual replica is alive (the model's images are encoded there)"
    until(
        lambda: reason in httpx.get(stack.url + "/readiness").json().get("reasons", []),
        timeout_s=20,
        what="/readiness naming the dead visual replica",
        every_s=0.25,
    )
    stack.start_service("visual-0")
    until(lambda: ask(300).status_code == 200, timeout_s=60, what="an image request after the restart", every_s=0.5)
    assert httpx.get(stack.url + "/readiness").status_code == 200
