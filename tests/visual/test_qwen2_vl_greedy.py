"""Qwen2-VL and Qwen2.5-VL with images, every part LightStream's own: the front end expands the
prompt (services/tokenizer/images), the visual service's family prepares and encodes the images
(services/visual/families/qwen2_vl.py), and the engine takes the request with its ImageSpans as
the worker's intake gives them (their grids make its M-RoPE positions), prefilling in chunks that
cut through an image and decoding greedily; the tokens equal Hugging Face's generate with its own
processor's pixel_values."""

from __future__ import annotations

import asyncio
import base64

import pytest
import torch

from services.tokenizer.images.front import ImageFront
from services.tokenizer.images.sources import ImageSource
from services.visual.families import load_tower
from services.visual.image_prep import open_rgb
from services.worker.build import build_engine
from services.worker.request import ImageSpan
from shared.config import TokenizerConfig, WorkerConfig
from shared.messages import GenerateReq, SamplingParams
from shared.model_config import ModelConfig
from tests import qwen_vl_reference as ref
from tests import vision_cases as vc
from tests.quant_models import dequantized_copy
from tools import make_tiny_model

NEW_TOKENS = 10


def _ours(model_dir: str, images, text: str) -> list[int]:
    vision = ModelConfig.from_dir(model_dir).vision
    front = ImageFront(TokenizerConfig(model_dir=model_dir), vision, "<|image_pad|>")
    sources = [ImageSource(base64.b64encode(vc.png(i)).decode(), f"i{n}") for n, i in enumerate(images)]
    checked = asyncio.run(front.load(sources))
    tok = ref.tokenizer(model_dir)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)["input_ids"]
    ids, prompt = front.expand(ids, checked, "messages")
    assert prompt is not None

    tower = load_tower(model_dir, vision, torch.float32, torch.device("cpu"))
    rows = tower.encode([tower.prepare(open_rgb(vc.png(i))) for i in images])
    spans = [ImageSpan(r.offset, x, tuple(r.grid)) for r, x in zip(prompt.refs, rows, strict=True)]
    req = GenerateReq("r", "front", "detok", ids, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), 0.0, 0.0)
    engine = build_engine(WorkerConfig(model_dir=model_dir, device="cpu", batch_max_tokens=16))
    engine.add(req, spans)
    tokens = []
    while engine.has_work():
        tokens += [t for _, item in engine.step().items for t in item.token_ids]
    return tokens


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_greedy_with_two_images_matches_hf(tiny_vl_models: dict[str, str], arch: str) -> None:
    model_dir = tiny_vl_models[arch]
    images = [ref.image(84, 56, seed=3), ref.image(200, 150, seed=4)]
    text = "Describe both pictures"
    inputs = ref.prompt(model_dir, text, images)
    with torch.no_grad():
        out = ref.model(model_dir).generate(
            **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    want = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert _ours(model_dir, images, text) == want


@pytest.mark.parametrize(("arch", "quant"), [("qwen2_vl", "gptq"), ("qwen2_5_vl", "fp8-block")])
def test_a_quantized_vision_language_model_matches_hf(arch: str, quant: str, tmp_path) -> None:
    """Its language model int4 or FP8, its tower (visual.*) unquantized: HF's greedy tokens on
    the dequantized twin."""
    model_dir, twin = str(tmp_path / arch), str(tmp_path / f"{arch}-dequantized")
    flags = ["--quant", quant, "--group-size", "32", "--block-size", "32"]
    make_tiny_model.main(["--arch", arch, "--out", model_dir, "--seed", "3", *flags])
    dequantized_copy(model_dir, twin)
    images = [ref.image(84, 56, seed=3)]
    inputs = ref.prompt(twin, "Describe", images)
    with torch.no_grad():
        out = ref.model(twin).generate(
            **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    assert _ours(model_dir, images, "Describe") == out[0, inputs["input_ids"].shape[1] :].tolist()
