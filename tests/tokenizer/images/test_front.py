"""The front end's side of images, without a stack: sources read or refused, files checked, the
prompt expanded to the count Hugging Face's processor gives (with Qwen2-VL's grids), a text-only
model refusing images."""

from __future__ import annotations

import asyncio
import base64

import pytest

from services.tokenizer.errors import APIError
from services.tokenizer.images.check import check_image
from services.tokenizer.images.front import ImageFront
from services.tokenizer.images.sources import ImageSource
from shared.config import TokenizerConfig
from shared.model_config import ModelConfig
from shared.vision_config import image_pseudo_id
from tests import qwen_vl_reference as qwen
from tests import vision_cases as vc


def _front(model_dir: str | None, **cfg) -> ImageFront:
    config = TokenizerConfig(model_dir=model_dir or "m", **cfg)
    vision = ModelConfig.from_dir(model_dir).vision if model_dir else None
    return ImageFront(config, vision, "<image>")


def _load(front: ImageFront, *sources: ImageSource):
    return asyncio.run(front.load(list(sources)))


def test_every_base64_spelling_reads_the_same_image(tiny_llava: str) -> None:
    data = vc.png(vc.image(1, 30, 20))
    std = base64.b64encode(data).decode()
    urlsafe = base64.urlsafe_b64encode(data).decode().rstrip("=")
    front = _front(tiny_llava)
    got = _load(
        front,
        ImageSource("data:image/png;base64," + std, "a"),
        ImageSource(std, "b"),
        ImageSource(urlsafe, "c", bare_base64=True),
        ImageSource(std[:40] + "\n" + std[40:], "d"),
    )
    assert {(i.hash, i.width, i.height) for i in got} == {(vc.content_hash(data), 30, 20)}


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("../secret.png", "only data:"),
        ("ftp://host/x.png", "only data:"),
        ("http://images.example.org.evil.com/x.png", "not allowed"),
        ("data:image/png,raw", "data:<type>;base64"),
    ],
)
def test_sources_that_are_not_read(tiny_llava: str, source: str, words: str) -> None:
    front = _front(tiny_llava, allowed_image_domains=("images.example.org",))
    with pytest.raises(APIError) as e:
        _load(front, ImageSource(source, "p"))
    assert e.value.status == 400 and words in e.value.message and e.value.param == "p"


def test_a_text_only_model_refuses_images() -> None:
    with pytest.raises(APIError) as e:
        _load(_front(None), ImageSource(base64.b64encode(vc.png(vc.image(1, 8, 8))).decode(), "images.0"))
    assert e.value.status == 400 and "text-only" in e.value.message and e.value.param == "images.0"


def test_the_pixel_limit_is_checked_before_decoding() -> None:
    data = vc.png(vc.image(0, 500, 400).convert("1"))
    with pytest.raises(APIError) as e:
        check_image(data, "p", max_bytes=10**6, max_pixels=500 * 400 - 1)
    assert e.value.status == 413 and "500x400" in e.value.message
    assert check_image(data, "p", max_bytes=10**6, max_pixels=500 * 400).width == 500


@pytest.mark.parametrize("family", ["tiny_llava", "tiny_llava_next"])
def test_expansion_gives_hf_processors_ids(request: pytest.FixtureRequest, family: str) -> None:
    tiny_llava = request.getfixturevalue(family)
    images = [vc.image(1, 60, 40), vc.image(2, 23, 70), vc.image(3, 100, 30)]
    text = "<s>A<image>B<image>C<image>"
    hf_ids = vc.hf_inputs(tiny_llava, text, images, add_special_tokens=False)["input_ids"][0].tolist()
    processor, _ = vc.hf_model(tiny_llava)
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    front = _front(tiny_llava)
    checked = _load(front, *(ImageSource(base64.b64encode(vc.png(i)).decode(), f"i{n}") for n, i in enumerate(images)))
    out, prompt = front.expand(ids, checked, "inputs")
    assert prompt is not None and len(out) == len(hf_ids)
    image_id = front.vision.image_token_id
    for ref, image in zip(prompt.refs, checked, strict=True):
        assert out[ref.offset : ref.offset + ref.length] == [image_pseudo_id(image.hash)] * ref.length
        assert hf_ids[ref.offset : ref.offset + ref.length] == [image_id] * ref.length
    assert [t for t in out if t >= 0] == [t for t in hf_ids if t != image_id]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_vl_expansion_gives_hf_processors_ids_and_grids(tiny_vl_models: dict[str, str], arch: str) -> None:
    model_dir = tiny_vl_models[arch]
    images = [qwen.image(84, 56, seed=1), qwen.image(200, 150, seed=2)]
    hf = qwen.prompt(model_dir, "Compare them", images)
    hf_ids = hf["input_ids"][0].tolist()
    tok = qwen.tokenizer(model_dir)
    content = [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare them"}]
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)["input_ids"]
    front = ImageFront(TokenizerConfig(model_dir=model_dir), ModelConfig.from_dir(model_dir).vision, "<|image_pad|>")
    checked = _load(front, *(ImageSource(base64.b64encode(vc.png(i)).decode(), f"i{n}") for n, i in enumerate(images)))
    out, prompt = front.expand(ids, checked, "messages")
    assert prompt is not None and len(out) == len(hf_ids)
    image_id = front.vision.image_token_id
    for r, image, (t, h, w) in zip(prompt.refs, checked, hf["image_grid_thw"].tolist(), strict=True):
        assert r.grid == [t, h // 2, w // 2] and r.length == t * h * w // 4
        assert out[r.offset : r.offset + r.length] == [image_pseudo_id(image.hash)] * r.length
        assert hf_ids[r.offset : r.offset + r.length] == [image_id] * r.length
    assert [t for t in out if t >= 0] == [t for t in hf_ids if t != image_id]
