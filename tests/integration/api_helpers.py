"""Helpers for the API tests: LightLLM's two generation routes as a client calls them,
Hugging Face logprobs and penalised greedy references, and Prometheus samples."""

from __future__ import annotations

import functools
import json

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families


async def generate(client: httpx.AsyncClient, prompt: str, max_new: int) -> dict:
    """POST /generate with details; the body."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "return_details": True}}
    r = await client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def generate_stream(client: httpx.AsyncClient, prompt: str, max_new: int) -> list[dict]:
    """POST /generate_stream; its events."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new}}
    events = []
    async with client.stream("POST", "/generate_stream", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


@functools.cache
def _model(model_dir: str):
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_logprobs(model_dir: str, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """[len(output_ids), vocab] log-softmax of the model's logits before each output token."""
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logits = _model(model_dir)(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def hf_penalised_greedy(
    model_dir: str,
    prompt_ids: list[int],
    steps: int,
    presence: float = 0.0,
    frequency: float = 0.0,
    repetition: float = 1.0,
) -> list[int]:
    """Greedy decoding (no EOS) with penalties: repetition over prompt and output (positive
    logits divided, negative multiplied), presence and frequency over the output, as OpenAI."""
    model = _model(model_dir)
    out: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([prompt_ids + out])).logits[0, -1].float()
        if repetition != 1.0:
            seen = torch.tensor(sorted(set(prompt_ids + out)))
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / repetition, vals * repetition)
        if out:
            counts = torch.bincount(torch.tensor(out), minlength=logits.shape[0]).float()
            logits -= frequency * counts + presence * (counts > 0).float()
        out.append(int(logits.argmax()))
    return out


def metric_samples(url: str, headers: dict[str, str] | None = None) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, from the front end's /metrics; the model_name label
    every series carries is checked to name the served model and left out of the keys."""
    r = httpx.get(url + "/metrics", headers=headers or {}, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[tuple, float] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = dict(s.labels)
            assert labels.pop("model_name", None), f"{s.name} has no model_name label"
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def delta(before: dict[tuple, float], after: dict[tuple, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)
