"""Qwen2-VL and Qwen2.5-VL with images, every part LightStream's own: the image processor
(processors/qwen2_vl.py) lays out the prompt and the patches, the vision tower encodes them, M-RoPE
positions come from the grids, and the engine's runner prefills (a chunk cut inside an image) and
decodes greedily; the tokens equal Hugging Face's generate with its own processor's pixel_values."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from services.visual.models.qwen2_vl_config import QwenVisionConfig
from services.visual.models.qwen2_vl_vision import load_tower
from services.visual.processors.qwen2_vl import QwenImageProcessor, expand_image_tokens
from services.worker.build import build_engine
from services.worker.mrope_index import rope_index
from services.worker.request import Req
from shared.config import WorkerConfig
from tests import qwen_vl_reference as ref
from tests.worker.engine_driver import request
from tests.worker.mm_steps import MMSteps

NEW_TOKENS = 10


def _ours(model_dir: str, images, text: str) -> list[int]:
    proc = QwenImageProcessor.from_dir(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tower = load_tower(model_dir, QwenVisionConfig.from_model_config(cfg), torch.float32, "cpu")
    done = [proc.preprocess(img) for img in images]
    grids = [g for _, g in done]
    embeds = tower.encode(torch.from_numpy(np.concatenate([p for p, _ in done])), grids)

    tok = ref.tokenizer(model_dir)
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)["input_ids"]
    image_id = cfg["image_token_id"]
    ids = expand_image_tokens(ids, image_id, [proc.num_tokens(i.height, i.width) for i in images])

    engine = build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))
    req = Req(request("r", ids, max_new_tokens=NEW_TOKENS), 0)
    req.rope = rope_index(ids, image_id, [(t, h // 2, w // 2) for t, h, w in grids])
    steps = MMSteps(engine)
    cut = ids.index(image_id) + 3
    steps.step([(req, cut)], [], {"r": embeds})
    steps.step([(req, len(ids) - cut)], [], {"r": embeds})
    for _ in range(NEW_TOKENS - 1):
        req.tokens.append(int(steps.logits["r"][-1][-1].argmax()))
        steps.step([], [req], {"r": embeds})
    req.tokens.append(int(steps.logits["r"][-1][-1].argmax()))
    return req.tokens[len(ids) :]


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
