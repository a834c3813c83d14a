"""The Qwen2-VL and Qwen2.5-VL language model (models/qwen2_vl.py) against Hugging Face's whole
Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration: greedy text-only output
through the engine, and every position's logits for a prompt with two images of different sizes
whose embeddings (Hugging Face's own tower's) fill the image positions (ImageSpans, as the worker's
intake makes them), with M-RoPE's positions from their grids, a chunk boundary inside an image,
decode steps after it (built as the general path builds them, or in the decode graphs' input layout,
which carries each decode's rotary position), and a text-only request in the same batches."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.worker.build import build_engine
from services.worker.engine import Engine
from services.worker.models.qwen2_vl import Qwen2VLModel
from services.worker.request import Req
from shared.config import WorkerConfig
from shared.model_config import ModelConfig
from tests import qwen_vl_reference as ref
from tests.worker.engine_driver import request, run
from tests.worker.mm_steps import MMSteps, image_req

ARCHS = ("qwen2_vl", "qwen2_5_vl")
EXTRA = [17, 230, 5, 99]  # tokens after each prompt, fed one decode step each


def _engine(model_dir: str) -> Engine:
    return build_engine(WorkerConfig(model_dir=model_dir, device="cpu"))


@pytest.mark.parametrize("arch", ARCHS)
def test_text_only_greedy_matches_hf(tiny_vl_models: dict[str, str], arch: str) -> None:
    model_dir = tiny_vl_models[arch]
    engine = _engine(model_dir)
    assert isinstance(engine.runner.model, Qwen2VLModel)
    tok = ref.tokenizer(model_dir)
    texts = ["Hello world", "Once upon a time there was a small town by the sea. Every morning the fishermen"]
    reqs, want = [], {}
    for i, text in enumerate(texts):
        ids = tok(text)["input_ids"]
        reqs.append(request(str(i), ids, max_new_tokens=12, ignore_eos=True))
        with torch.no_grad():
            out = ref.model(model_dir).generate(
                torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        want[str(i)] = out[0, len(ids) :].tolist()
    got = run(engine, reqs)
    assert {rid: o.tokens for rid, o in got.items()} == want


def _hf_logits(model_dir: str, inputs: dict[str, torch.Tensor], extra: list[int]) -> torch.Tensor:
    """[L + len(extra), V]: Hugging Face's logits after each token of the prompt and extra."""
    ids = torch.cat([inputs["input_ids"], torch.tensor([extra])], dim=1)
    kwargs = {k: v for k, v in inputs.items() if k not in ("input_ids", "mm_token_type_ids")}
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(extra), dtype=torch.int32)], dim=1)
    with torch.no_grad():
        return ref.model(model_dir)(input_ids=ids, mm_token_type_ids=types, **kwargs).logits[0]


def _image_embeds(model_dir: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """[image tokens, H]: Hugging Face's vision tower's output for the prompt's images, in order."""
    with torch.no_grad():
        out = ref.model(model_dir).model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    return torch.cat(out.pooler_output)


@pytest.mark.parametrize(("arch", "staged"), [("qwen2_vl", False), ("qwen2_5_vl", False), ("qwen2_5_vl", True)])
def test_image_prompt_logits_match_hf(tiny_vl_models: dict[str, str], arch: str, staged: bool) -> None:
    _image_prompt_logits_match_hf(tiny_vl_models[arch], _engine(tiny_vl_models[arch]), staged)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_image_decodes_in_cuda_graphs_match_hf(tiny_vl_models: dict[str, str]) -> None:
    """The decode steps of an image request replay the decode graphs (each token's rotary position
    in their inputs), float32 on the GPU, against Hugging Face on the CPU."""
    model_dir = tiny_vl_models["qwen2_5_vl"]
    cfg = WorkerConfig(model_dir=model_dir, device="cuda", dtype="float32", max_total_token_num=65536)
    engine = build_engine(cfg)
    assert engine.runner.graphs is not None
    replays = []
    replay = engine.runner.graphs.replay
    engine.runner.graphs.replay = lambda batch: replays.append(batch.num_decodes) or replay(batch)
    # float32 on the GPU against the CPU: only the order of the sums differs
    _image_prompt_logits_match_hf(model_dir, engine, staged=True, tol=1e-3)
    assert replays == [2] * len(EXTRA)


def _image_prompt_logits_match_hf(model_dir: str, engine: Engine, staged: bool, tol: float = 1e-4) -> None:
    image_id = ModelConfig.from_dir(model_dir).vision.image_token_id
    images = [ref.image(84, 56, seed=1), ref.image(70, 130, seed=2)]
    inputs = ref.prompt(model_dir, "What differs between these?", images)
    text = ref.tokenizer(model_dir)("A text-only request beside it")["input_ids"]
    prompt = inputs["input_ids"][0].tolist()
    want_image = _hf_logits(model_dir, inputs, EXTRA)
    with torch.no_grad():
        want_text = ref.model(model_dir)(input_ids=torch.tensor([text + EXTRA])).logits[0]

    grids = [(t, h // 2, w // 2) for t, h, w in inputs["image_grid_thw"].tolist()]
    rows = _image_embeds(model_dir, inputs).to(engine.device)
    a = image_req("img", prompt, image_id, rows, grids, max_new_tokens=8)
    assert a.rope is not None and a.rope.delta < 0
    b = Req(request("txt", text, max_new_tokens=8), 1)
    cut = prompt.index(image_id) + 5  # the first chunk ends inside the first image
    d = MMSteps(engine, staged)
    d.step([(a, cut), (b, len(text))], [])
    d.step([(a, len(prompt) - cut)], [])
    for tok in EXTRA:
        for r in (a, b):
            r.tokens.append(tok)
        d.step([], [a, b])
    assert d.staged_steps == (len(EXTRA) if staged else 0)
    got_image = torch.cat(d.logits["img"]).cpu()
    got_text = torch.cat(d.logits["txt"]).cpu()
    torch.testing.assert_close(got_image, want_image, rtol=tol, atol=tol)
    torch.testing.assert_close(got_text, want_text[: len(text) + len(EXTRA)], rtol=tol, atol=tol)


def test_transformers_4_checkpoint_names_load_the_same(tiny_vl_models: dict[str, str], tmp_path) -> None:
    """transformers 4.5x saved the language model under model.language_model. and the tower under
    model.visual.: the same weights under those names give the same logits."""
    src = tiny_vl_models["qwen2_5_vl"]
    dst = str(tmp_path / "renamed")
    shutil.copytree(src, dst)
    weights = load_file(os.path.join(src, "model.safetensors"))
    renamed = {}
    for name, t in weights.items():
        if name.startswith("model."):
            name = "model.language_model." + name[len("model.") :]
        elif name.startswith("visual."):
            name = "model." + name
        renamed[name] = t
    assert "model.language_model.embed_tokens.weight" in renamed
    save_file(renamed, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    ids = ref.tokenizer(src)("Hello there, world")["input_ids"]
    reqs = [request("0", ids, max_new_tokens=6, ignore_eos=True)]
    assert run(_engine(dst), reqs)["0"].tokens == run(_engine(src), reqs)["0"].tokens
