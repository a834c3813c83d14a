"""The Hugging Face peer for vision-language models: transformers' model built from a model
directory's config.json with random weights, on the requests tools/bench_vision.py sends the
engine, through batched generate.

    python tools/peer_vision.py --model-dir DIR --out FILE.json [--requests 64] [--batch-size 32]
        [--image-size 448] [--image-seed 0] [--device cuda] [--deadline-s 300]

The requests: the first --requests of the fixed sharegpt_shaped workload, request k with one
synthetic image drawn from seed --image-seed + k (tools/bench_images.py: the engine's images,
byte for byte), its prompt the workload's random token ids at its input length (as
benchmark_serving draws them) after the image's tokens, greedy, EOS ignored. Hugging Face's own
image processor prepares each image (AutoImageProcessor from the directory); the image's
placeholder is expanded to the count its processor gives (LLaVA: one per patch; Qwen2-VL:
<|vision_start|>, t * h * w / 4 <|image_pad|>, <|vision_end|>).

transformers' continuous batching takes token ids only, no images, so the peer runs batched
generate: the requests in order in batches of --batch-size, left-padded, each batch to its
longest output length (min_new_tokens = max_new_tokens, no EOS). A request counts as done when
its batch ends. Reports requests/s, the requested output tokens/s (each request's own length)
and the generated tokens/s (every row to the batch's longest). It stops after the batch that
passes --deadline-s and says so. In bf16 on CUDA; float32 on the CPU (tests, tiny models).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import traceback

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from PIL import Image

from tools.bench_images import synthetic_png
from tools.workload import random_prompts, sharegpt_shaped

PAD = 0


def read_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def prompt_vocab(model_dir: str) -> int:
    """Prompt ids are drawn below this (from a quarter of it, tools/workload.py's random_prompts):
    the first special token's id in that range (the image tokens are among them, and an image
    token in the text would be taken for an image), else the vocabulary's size."""
    cfg = read_config(model_dir)
    vocab = int(cfg.get("text_config", cfg)["vocab_size"])
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.exists(path):
        with open(path) as f:
            added = [int(t["id"]) for t in json.load(f).get("added_tokens", [])]
        vocab = min([vocab, *(i for i in added if i >= vocab // 4)])
    return vocab


def requests(n: int, vocab: int, image_size: int, image_seed: int) -> list[dict]:
    """The engine's requests: prompt ids, output length and PNG image bytes, in order."""
    pairs = sharegpt_shaped(n)
    prompts = random_prompts([i for i, _ in pairs], vocab, seed=1)
    return [
        {"ids": ids, "out": out, "png": synthetic_png(image_seed + k, image_size)}
        for k, (ids, (_, out)) in enumerate(zip(prompts, pairs, strict=True))
    ]


def image_tokens(cfg: dict, processed: dict, k: int) -> list[int]:
    """Image k's placeholder ids, expanded as the family's processor expands them."""
    if "image_grid_thw" in processed:  # Qwen2-VL / Qwen2.5-VL
        t, h, w = (int(x) for x in processed["image_grid_thw"][k])
        merge = int(cfg["vision_config"].get("spatial_merge_size", 2))
        pads = [cfg["image_token_id"]] * (t * h * w // merge**2)
        return [cfg["vision_start_token_id"], *pads, cfg["vision_end_token_id"]]
    vision = cfg["vision_config"]
    count = (vision["image_size"] // vision["patch_size"]) ** 2
    if cfg.get("vision_feature_select_strategy", "default") == "full":
        count += 1
    return [cfg.get("bos_token_id", 1), *[cfg["image_token_index"]] * count]


def batch_inputs(cfg: dict, processor, reqs: list[dict], device: str) -> dict:
    """One batch's generate inputs: left-padded ids and mask, the processor's pixel values."""
    images = [Image.open(io.BytesIO(r["png"])).convert("RGB") for r in reqs]
    processed = processor(images=images, return_tensors="pt")
    rows = [image_tokens(cfg, processed, k) + r["ids"] for k, r in enumerate(reqs)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        **{k: v for k, v in processed.items() if k != "pixel_attention_mask"},
    }
    return {k: v.to(device) for k, v in out.items()}


def build(model_dir: str, device: str):
    """-> (model with random weights in bf16 on CUDA or float32 on the CPU, image processor, config)."""
    import transformers
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageTextToText

    transformers.logging.set_verbosity_error()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_dir))
    torch.set_default_dtype(torch.float32)
    processor = AutoImageProcessor.from_pretrained(model_dir)
    return model.eval(), processor, read_config(model_dir)


def generate(model, inputs: dict, new_tokens: int) -> int:
    """Greedy, no EOS, exactly new_tokens a row; -> tokens generated per row."""
    with torch.inference_mode():
        out = model.generate(
            **inputs,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=PAD,
        )
    return out.shape[1] - inputs["input_ids"].shape[1]


def run(args: argparse.Namespace, model, processor, cfg: dict, reqs: list[dict]) -> dict:
    """The batches in turn until done or past the deadline -> the figures."""
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    generate(model, batch_inputs(cfg, processor, reqs[:1], args.device), 4)  # warm-up
    sync()
    start = time.perf_counter()
    done, wanted, generated, stopped, batches = 0, 0, 0, "", []
    for at in range(0, len(reqs), args.batch_size):
        if time.perf_counter() - start > args.deadline_s:
            stopped = f"deadline: {done}/{len(reqs)} done in {args.deadline_s}s"
            break
        batch = reqs[at : at + args.batch_size]
        t = time.perf_counter()
        rows = generate(model, batch_inputs(cfg, processor, batch, args.device), max(r["out"] for r in batch))
        sync()
        done += len(batch)
        wanted += sum(r["out"] for r in batch)
        generated += rows * len(batch)
        batches.append({"requests": len(batch), "new_tokens": rows, "seconds": time.perf_counter() - t})
    seconds = time.perf_counter() - start
    return {
        "requests": len(reqs),
        "requests_done": done,
        "stopped": stopped,
        "seconds": seconds,
        "req_per_s": done / seconds,
        "images_per_s": done / seconds,
        "output_tok_per_s": wanted / seconds,
        "generated_tok_per_s": generated / seconds,
        "batches": batches,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="a vision-language config.json's folder (and its processor)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--image-seed", type=int, default=0, help="request k's image is drawn from this seed + k")
    ap.add_argument("--max-output", type=int, default=0, help="cap on each request's output length; 0: none")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--deadline-s", type=float, default=300.0, help="no batch starts after this")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    res: dict = {"args": vars(args), "torch": torch.__version__}
    try:
        import transformers

        res["transformers"] = transformers.__version__
        t = time.perf_counter()
        model, processor, cfg = build(args.model_dir, args.device)
        res["model_init_s"] = time.perf_counter() - t
        reqs = requests(args.requests, prompt_vocab(args.model_dir), args.image_size, args.image_seed)
        if args.max_output:
            reqs = [{**r, "out": min(r["out"], args.max_output)} for r in reqs]
        res["workload"] = {"n": len(reqs), "mean_in": sum(len(r["ids"]) for r in reqs) / len(reqs)}
        res["workload"]["mean_out"] = sum(r["out"] for r in reqs) / len(reqs)
        res["batched"] = run(args, model, processor, cfg, reqs)
    except Exception as e:  # recorded: a peer's failure is a finding
        res["error"] = repr(e)
        res["trace"] = traceback.format_exc()[-2000:]
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "trace"})[:800], flush=True)
    return res


if __name__ == "__main__":
    main()
