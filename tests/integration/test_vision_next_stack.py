"""A tiny LLaVA-NeXT through the whole stack: any-resolution tiles, unpadding and image_newline
give Hugging Face's greedy answers for one and two images of different sizes, through
/v1/chat/completions (the openai client) and /generate (multimodal_params). The pipeline's
other behaviour is test_vision_stack.py's, over LLaVA-1.5."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests import vision_cases as vc
from tests.integration.conftest import start_stack
from tests.integration.vision_helpers import b64, chat_content, hf_chat_text, hf_generate_text
from tools.stack import Stack

MAX_NEW = 10


@pytest.fixture(scope="module")
def stack(tiny_llava_next: str, redis_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(
        tiny_llava_next,
        redis_server,
        str(tmp_path_factory.mktemp("logs-vision-next")),
        tokenizer_args=["--model-name", "tiny-llava-next"],
        worker_args=["--batch-max-tokens", "32"],  # chunks that cut through an image's rows
    )
    s.model_dir = tiny_llava_next  # type: ignore[attr-defined]
    yield s
    s.stop()


def test_chat_with_two_images_equals_hf(stack: Stack) -> None:
    images, text = [vc.image(21, 60, 40), vc.image(22, 23, 70)], "Compare them."
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=60)
    r = client.chat.completions.create(
        model="tiny-llava-next",
        messages=[{"role": "user", "content": chat_content(text, images)}],
        max_tokens=MAX_NEW,
        temperature=0,
    )
    assert r.choices[0].message.content == hf_chat_text(stack.model_dir, text, images, MAX_NEW)


def test_generate_with_one_wide_image_equals_hf(stack: Stack) -> None:
    image, prompt = vc.image(23, 100, 30), "<image>Describe it."
    body = {
        "inputs": prompt,
        "parameters": {"max_new_tokens": MAX_NEW},
        "multimodal_params": {"images": [{"type": "base64", "data": b64(image)}]},
    }
    r = httpx.post(stack.url + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"][0] == hf_generate_text(stack.model_dir, prompt, [image], MAX_NEW)
