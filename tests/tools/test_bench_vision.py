"""tools/bench_vision.py and its parts on the CPU, so the script behind issue 49's GPU rows cannot
rot: the real-shape model directories (config, processor files, image tokens at their ids), the
towers' FLOPs per image, the peer's requests and its run on the tiny models, the report's figures,
and (opt-in, -m bench) the whole benchmark through the stack on the tiny LLaVA and Qwen2.5-VL with
the peer. Timings mean nothing here."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from shared.model_config import ModelConfig
from tools import bench_vision, peer_vision, vision_bench_models
from tools.vision_flops import flops_per_image
from tools.vision_report import encoder_figures, family_ratios
from tools.workload import sharegpt_shaped


@pytest.fixture(scope="module")
def real_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vision-shapes")
    return {s: vision_bench_models.write(str(root / s), s) for s in vision_bench_models.SHAPES}


def test_real_shapes_and_their_image_tokens(real_dirs: dict[str, str]) -> None:
    llava, qwen = (ModelConfig.from_dir(real_dirs[s]) for s in vision_bench_models.SHAPES)
    assert (llava.hidden_size, llava.num_layers, llava.vocab_size, llava.vision.family) == (4096, 32, 32064, "llava")
    assert (llava.vision.image_size, llava.vision.tokens_per_tile) == (336, 576)
    assert (qwen.hidden_size, qwen.num_layers, qwen.num_kv_heads, qwen.mrope_section) == (3584, 28, 4, (16, 24, 24))
    tok = AutoTokenizer.from_pretrained(real_dirs["llava-1.5-7b"])
    assert tok.convert_ids_to_tokens([32000]) == ["<image>"] and len(tok) == 32064
    tok = AutoTokenizer.from_pretrained(real_dirs["qwen2.5-vl-7b"])
    assert tok.convert_ids_to_tokens([151652, 151655, 151653]) == [
        "<|vision_start|>",
        "<|image_pad|>",
        "<|vision_end|>",
    ]
    assert len(tok) == 152064
    # prompt ids stay below the special tokens, image tokens among them
    assert [peer_vision.prompt_vocab(real_dirs[s]) for s in vision_bench_models.SHAPES] == [31808, 151643]


def test_flops_per_image(real_dirs: dict[str, str]) -> None:
    """CLIP ViT-L/14-336 over 577 positions, 23 layers run, the projector: about 390 GFLOP; Qwen2.5-VL's
    tower over 448 x 448 (1024 patches, 28 windowed blocks and 4 full): about 1.35 TFLOP."""
    got = {}
    for shape, path in real_dirs.items():
        cfg = ModelConfig.from_dir(path)
        got[shape] = flops_per_image(cfg.vision, cfg.hidden_size, 448, 448) / 1e9
    assert 385 < got["llava-1.5-7b"] < 395 and 1300 < got["qwen2.5-vl-7b"] < 1400


def test_peer_requests_match_the_engines(tiny_llava: str) -> None:
    reqs = peer_vision.requests(3, 1000, 448, 7)
    assert [(len(r["ids"]), r["out"]) for r in reqs] == sharegpt_shaped(3)
    again = peer_vision.requests(3, 1000, 448, 7)
    assert [r["png"] for r in reqs] == [r["png"] for r in again] and reqs[0]["png"] != reqs[1]["png"]


@pytest.mark.parametrize("which", ["llava", "qwen2_5_vl"])
def test_peer_on_the_cpu(which: str, tiny_llava: str, tiny_vl_models: dict[str, str], tmp_path) -> None:
    model_dir = tiny_llava if which == "llava" else tiny_vl_models[which]
    out = str(tmp_path / "peer.json")
    argv = ["--model-dir", model_dir, "--out", out, "--requests", "3", "--batch-size", "2", "--device", "cpu"]
    res = peer_vision.main([*argv, "--max-output", "5"])
    assert "error" not in res, res.get("trace")
    run = res["batched"]
    assert run["requests_done"] == 3 and [b["new_tokens"] for b in run["batches"]] == [5, 5]
    with open(out) as f:
        assert json.load(f)["batched"]["req_per_s"] > 0


def test_report_figures() -> None:
    run = {"serving": {"duration_s": 2.0, "req_per_s": 4.0}, "visual": {"before": {"v0": _c(2, 0.5)}}}
    run["visual"]["after"] = {"v0": _c(10, 1.5), "v1": _c(6, 1.0)}
    enc = encoder_figures(run, 1e12, 100.0)
    assert enc["images"] == 14 and enc["images_per_s"] == 7.0 and enc["wall_TFLOPs"] == 7.0
    v0 = enc["replicas"]["v0"]
    assert (v0["images"], v0["tower_images_per_s"], v0["tower_TFLOPs"], v0["tower_busy"]) == (8, 8.0, 8.0, 0.5)
    assert v0["tower_of_matmul"] == 0.08
    runs = {f"m-v{c}-{k}": {"serving": {"req_per_s": r}, "encoder": {"images_per_s": i}}
            for c, k, r, i in ((2, "encode", 9.0, 30.0), (1, "encode", 9.0, 20.0), (1, "serve", 3.0, 5.0),
                               (2, "serve", 3.0, 5.0))}  # fmt: skip
    peer = {"batched": {"requests": 4, "requests_done": 4, "stopped": "", "req_per_s": 0.25}}
    got = family_ratios({"runs": runs, "peer": peer}, "m", [2, 1])
    assert got["encode_v2_over_v1"] == 1.5 and got["stack_over_peer"] == 12.0
    peer["batched"]["stopped"] = "deadline: 2/4 done in 10s"
    assert family_ratios({"runs": runs, "peer": peer}, "m", [2, 1])["peer_error"].startswith("deadline")


def _c(images: int, tower_s: float) -> dict[str, float]:
    return {k: 0.0 for k in ("encode_seconds", "batches", "cache_misses", "cache_hits")} | {
        "images": images,
        "tower_seconds": tower_s,
    }


@pytest.mark.bench
def test_bench_vision_end_to_end_on_the_cpu(tiny_llava: str, tiny_vl_models: dict[str, str], tmp_path) -> None:
    """Both families through the stack with two visual replicas, then one, and the peer: every
    request completes, the encoder's counters account for every image, the ratios are there."""
    argv = ["--out-dir", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"), "--device", "cpu"]
    argv += ["--model", f"llava={tiny_llava}", "--model", f"qwen2_5_vl={tiny_vl_models['qwen2_5_vl']}"]
    argv += ["--requests", "2", "--encode-requests", "3", "--warmup-requests", "2", "--peer-batch", "2"]
    res = bench_vision.main(argv)
    assert res["matmul"]["matmul_TFLOPs"] > 0
    for family, row in res["families"].items():
        for name, run in row["runs"].items():
            assert run["serving"]["completed"] == run["requests"] and not run["serving"]["failed"], name
            assert run["encoder"]["images"] == run["requests"], name  # each image encoded once, no other
            assert len(run["encoder"]["replicas"]) == run["visuals"], name
        ratios = row["ratios"]
        assert ratios["stack_over_peer"] > 0 and ratios["encode_v2_over_v1"] > 0, (family, ratios)
    with open(tmp_path / "out" / "vision.json") as f:
        assert json.load(f)["families"].keys() == {"llava", "qwen2_5_vl"}
