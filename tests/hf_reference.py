"""Hugging Face transformers as the reference: greedy continuations of prompts."""

from __future__ import annotations

import functools

import torch

EAGER = ("gemma2", "gemma3_text")  # model types Hugging Face runs with eager attention here


@functools.cache
def _load(model_dir: str):
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    # eager attention where its arithmetic is the reference's own: Gemma 2's soft cap (SDPA has none)
    eager = transformers.AutoConfig.from_pretrained(model_dir).model_type in EAGER
    kwargs = {"attn_implementation": "eager"} if eager else {}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    model.eval()
    return AutoTokenizer.from_pretrained(model_dir), model


def tokenizer(model_dir: str):
    return _load(model_dir)[0]


def greedy(model_dir: str, prompt_ids: list[int], max_new_tokens: int, eos: bool = True) -> list[int]:
    """HF's greedy continuation (ends at the model's EOS tokens unless eos=False)."""
    _, model = _load(model_dir)
    ids = torch.tensor([prompt_ids])
    kwargs = {} if eos else {"eos_token_id": None}
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.config.vocab_size - 1,
            **kwargs,
        )
    return out[0, len(prompt_ids) :].tolist()


def top1_teacher_forced(model_dir: str, ids: list[int]) -> list[int]:
    """HF's most likely next token at every position of ids (one forward, no sampling)."""
    _, model = _load(model_dir)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].argmax(-1).tolist()


def prompt_logprobs(model_dir: str, ids: list[int]) -> torch.Tensor:
    """HF's log-softmax at every position of ids but the last [len(ids) - 1, V], float32: row p is
    the distribution of the token at p + 1 (one forward, teacher forcing)."""
    _, model = _load(model_dir)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
