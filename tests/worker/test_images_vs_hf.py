"""A LLaVA request through the engine: its images' embeddings (the visual service's tower)
scattered into the prompt at prefill give Hugging Face's greedy tokens, whole or in chunks that
cut through an image; the prompt cache never lends one image's KV to another at the same
positions, and does lend it to the same image."""

from __future__ import annotations

import pytest
import torch

from services.visual.families import load_tower
from services.worker.build import build_engine
from services.worker.request import ImageSpan
from shared.config import WorkerConfig
from shared.messages import GenerateReq, ImageRef, SamplingParams
from shared.model_config import ModelConfig
from shared.vision_config import image_pseudo_id
from tests import vision_cases as vc
from tests.quant_models import dequantized_copy
from tools import make_tiny_model

TEXT = "<s><|im_start|>user\n<image>Describe<image> both.<|im_end|>\n<|im_start|>assistant\n"
MAX_NEW = 8


def _request(model_dir: str, rid: str, text: str, images) -> tuple[GenerateReq, list[ImageSpan]]:
    """The request the front end and the visual service would make: placeholders expanded,
    each image's positions holding its pseudo-id, and its embeddings."""
    cfg = ModelConfig.from_dir(model_dir)
    tower = load_tower(model_dir, cfg.vision, torch.float32, torch.device("cpu"))
    ids = vc.hf_inputs(model_dir, text, images, add_special_tokens=False)["input_ids"][0].tolist()
    rows = tower.encode([tower.prepare(i) for i in images])
    refs, spans, k = [], [], 0
    for n, img in enumerate(images):
        h = vc.content_hash(vc.png(img))
        start = ids.index(cfg.vision.image_token_id, k)
        length = rows[n].shape[0]
        assert ids[start : start + length] == [cfg.vision.image_token_id] * length
        ids[start : start + length] = [image_pseudo_id(h)] * length
        refs.append(ImageRef(h, start, length))
        spans.append(ImageSpan(start, rows[n]))
        k = start + length
    req = GenerateReq(rid, "front", "detok", ids, SamplingParams(max_new_tokens=MAX_NEW), 0.0, 0.0, images=refs)
    return req, spans


def _run(engine, reqs: list[tuple[GenerateReq, list[ImageSpan]]]) -> dict[str, tuple[list[int], int]]:
    """Each request's tokens and its cached prompt tokens, run one after another."""
    out = {}
    for req, spans in reqs:
        engine.add(req, spans)
        tokens, cached = [], 0
        while engine.has_work():
            for _, item in engine.step().items:
                tokens += item.token_ids
                cached = max(cached, item.cached_tokens)
        out[req.rid] = (tokens, cached)
    return out


@pytest.mark.parametrize("chunk", [8192, 16], ids=["whole", "chunked"])
@pytest.mark.parametrize("family", ["tiny_llava", "tiny_llava_next"])
def test_two_images_of_different_sizes_match_hf(request: pytest.FixtureRequest, family: str, chunk: int) -> None:
    model_dir = request.getfixturevalue(family)
    images = [vc.image(1, 60, 40), vc.image(2, 23, 70)]
    want = vc.hf_greedy(model_dir, TEXT, images, MAX_NEW, add_special_tokens=False)
    engine = build_engine(WorkerConfig(model_dir=model_dir, device="cpu", batch_max_tokens=chunk))
    got = _run(engine, [_request(model_dir, "a", TEXT, images)])["a"][0]
    assert got == want


@pytest.mark.parametrize(("arch", "quant"), [("llava", "awq"), ("llava_next", "fp8")])
def test_a_quantized_llava_matches_hf_on_its_dequantized_weights(arch: str, quant: str, tmp_path) -> None:
    """Its language model's projections int4 or FP8 (config.json's top-level quantization_config
    carried down to the text model), its tower unquantized as the quantizers leave it: HF's
    greedy tokens on the dequantized twin."""
    model_dir, twin = str(tmp_path / arch), str(tmp_path / f"{arch}-dequantized")
    make_tiny_model.main(["--arch", arch, "--out", model_dir, "--seed", "3", "--quant", quant, "--group-size", "32"])
    dequantized_copy(model_dir, twin)
    assert ModelConfig.from_dir(model_dir).quantization is not None
    images = [vc.image(1, 60, 40), vc.image(2, 23, 70)]
    want = vc.hf_greedy(twin, TEXT, images, MAX_NEW, add_special_tokens=False)
    engine = build_engine(WorkerConfig(model_dir=model_dir, device="cpu", batch_max_tokens=16))
    assert _run(engine, [_request(twin, "a", TEXT, images)])["a"][0] == want  # the twin's processor: HF's own


def test_prompt_cache_keys_image_positions_by_image(tiny_llava: str) -> None:
    first, second = [vc.image(3, 40, 40), vc.image(4, 50, 30)], [vc.image(5, 40, 40), vc.image(4, 50, 30)]
    want = vc.hf_greedy(tiny_llava, TEXT, second, MAX_NEW, add_special_tokens=False)
    engine = build_engine(WorkerConfig(model_dir=tiny_llava, device="cpu"))
    a, b, again = (_request(tiny_llava, rid, TEXT, imgs) for rid, imgs in (("a", first), ("b", second), ("c", second)))
    out = _run(engine, [a, b, again])
    assert out["b"][0] == want  # the same placeholder ids as a's, another first image: a's KV not reused
    image_start = a[0].images[0].offset
    assert out["b"][1] <= image_start  # b shares the text before the first image only
    assert out["c"][0] == want and out["c"][1] == len(again[0].input_ids) - 1  # the same images: all cached
