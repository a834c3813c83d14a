"""A tiny Qwen2-VL and a tiny Qwen2.5-VL through the whole stack (front end, visual replica,
router, worker, detokenizer): the front end expands each image to the processor's count and
grid, the visual service encodes it with the Qwen tower and caches it, the worker fills the
image positions and follows the grids with M-RoPE positions; greedy answers with one and two
images of different sizes equal Hugging Face's, through /v1/chat/completions (the openai client,
data URLs) and /generate (multimodal_params), in prefill chunks that cut through the images; an
image sent again is encoded once; text alone still works. The pipeline's other behaviour is
test_vision_stack.py's, over LLaVA-1.5."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests import qwen_vl_reference as ref
from tests.integration.conftest import start_stack
from tests.integration.vision_helpers import b64, cache_counts, chat_content
from tools.redis_server import free_port
from tools.stack import Stack

MAX_NEW = 10
PAD = "<|vision_start|><|image_pad|><|vision_end|>"  # what the chat template writes for an image


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def stack(request: pytest.FixtureRequest, tiny_vl_models: dict[str, str], redis_server, tmp_path_factory) -> Iterator:
    model_dir = tiny_vl_models[request.param]
    metrics_port = free_port()
    s = start_stack(
        model_dir,
        redis_server,
        str(tmp_path_factory.mktemp(f"logs-{request.param}")),
        tokenizer_args=["--model-name", "tiny-qwen-vl"],
        worker_args=["--batch-max-tokens", "16"],  # prompts go in chunks that cut through images
        visual_args=["--metrics-port", str(metrics_port)],
    )
    s.model_dir = model_dir  # type: ignore[attr-defined]
    s.visual_metrics = f"http://127.0.0.1:{metrics_port}"  # type: ignore[attr-defined]
    yield s
    s.stop()


@pytest.mark.parametrize("sizes", [[(84, 56)], [(70, 130), (200, 150)]], ids=["one", "two"])
def test_chat_with_images_equals_hf(stack: Stack, sizes) -> None:
    images = [ref.image(w, h, seed=10 + i) for i, (w, h) in enumerate(sizes)]
    text = "What is in the picture?"
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=60)
    r = client.chat.completions.create(
        model="tiny-qwen-vl",
        messages=[{"role": "user", "content": chat_content(text, images)}],
        max_tokens=MAX_NEW,
        temperature=0,
    )
    want = ref.greedy_text(stack.model_dir, ref.prompt(stack.model_dir, text, images), MAX_NEW)
    assert r.choices[0].message.content == want
    hf_len = ref.prompt(stack.model_dir, text, images)["input_ids"].shape[1]
    assert r.usage.prompt_tokens == hf_len  # the images' positions count as prompt tokens


def test_generate_with_multimodal_params_equals_hf(stack: Stack) -> None:
    images = [ref.image(57, 120, seed=21), ref.image(90, 60, seed=22)]
    prompt = f"{PAD}and{PAD}Describe them."
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": MAX_NEW},
        "multimodal_params": {"images": [{"type": "base64", "data": b64(i)} for i in images]},
    }
    r = httpx.post(stack.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    want = ref.greedy_text(stack.model_dir, ref.inputs(stack.model_dir, prompt, images), MAX_NEW)
    assert r.json()["generated_text"][0] == want


def test_an_image_sent_again_is_encoded_once(stack: Stack) -> None:
    image = ref.image(64, 64, seed=99)  # sent by no other test
    hits, misses = cache_counts(stack.visual_metrics)
    body = {"inputs": PAD + "Again?", "parameters": {"max_new_tokens": 2},
            "multimodal_params": {"images": [{"type": "base64", "data": b64(image)}]}}  # fmt: skip
    answers = [httpx.post(stack.url + "/generate", json=body, timeout=60) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 200]
    first, again = (a.json() for a in answers)
    assert first["generated_text"] == again["generated_text"]
    assert again["prompt_cache_len"] > first["prompt_cache_len"]  # the image's positions cached too
    assert cache_counts(stack.visual_metrics) == (hits + 1, misses + 1)


def test_text_alone_to_a_vision_model(stack: Stack) -> None:
    prompt = "The quick brown fox"
    r = httpx.post(stack.url + "/generate", json={"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW}})
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"][0] == ref.greedy_text(
        stack.model_dir, ref.inputs(stack.model_dir, prompt, []), MAX_NEW
    )
